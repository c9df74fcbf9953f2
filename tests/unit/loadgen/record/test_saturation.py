"""The saturation point of a capacity run, read from run directories written by
hand: which step, which samples, which figure, per replica."""

from __future__ import annotations

from pathlib import Path

import pytest

from servemon.core.errors import ConfigError
from servemon.loadgen.record.runrecord import TierResult
from servemon.loadgen.record.saturation import saturation_point
from tests.support.capacityruns import write_capacity_run

#: Steps at 4, 8, 16 (bad), 10 (good: the capacity) and 11 (bad) req/s.
RATES = (4.0, 8.0, 16.0, 10.0, 11.0)
GOOD = (True, True, False, True, False)
#: At 10 req/s: a burst inside the settle time, then 0, 1, 2, 1 waiting.
AT_CAPACITY = [
    (0.5, [(100.0, 0.9)]),
    (1.5, [(0.0, 0.2)]),
    (2.5, [(1.0, 0.3)]),
    (3.5, [(2.0, 0.5)]),
    (4.5, [(1.0, 0.4)]),
]
SAMPLES = {1: [(2.0, [(7.0, 0.1)])], 3: AT_CAPACITY, 4: [(2.0, [(9.0, 0.9)])]}


def test_mean_of_the_queue_over_the_capacity_step_after_its_settle(
    tmp_path: Path,
) -> None:
    run = write_capacity_run(tmp_path / "run", RATES, GOOD, SAMPLES)
    point = saturation_point(run, at="capacity")
    assert (point.signal, point.found, point.capacity_rps) == ("queue", True, 10.0)
    assert (point.at, point.below, point.above) == ("capacity", None, None)
    assert (point.stage, point.samples, point.settle_s) == (3, 4, 1.0)
    assert point.value == pytest.approx(1.0)
    assert point.slo == "ttft_p95<=0.5"


def test_p90_is_the_nearest_rank(tmp_path: Path) -> None:
    run = write_capacity_run(tmp_path / "run", RATES, GOOD, SAMPLES)
    assert saturation_point(run, statistic="p90").value == 2.0


def test_ranks_sum_for_the_queue_and_the_fullest_counts_for_kv(
    tmp_path: Path,
) -> None:
    two = {3: [(2.0, [(1.0, 0.25), (2.0, 0.75)])]}
    run = write_capacity_run(tmp_path / "run", RATES, GOOD, two)
    assert saturation_point(run).value == 3.0
    kv = saturation_point(run, signal="kv_cache")
    assert (kv.value, kv.found) == (0.75, False)


def test_a_fleet_measured_together_is_divided_per_replica(tmp_path: Path) -> None:
    run = write_capacity_run(tmp_path / "run", RATES, GOOD, SAMPLES)
    assert saturation_point(run, measured_replicas=4).value == pytest.approx(0.25)
    # KV usage is the fullest engine's already: not divided.
    kv = saturation_point(run, signal="kv_cache", measured_replicas=4)
    assert kv.value == pytest.approx(0.35)


def test_a_client_limit_is_no_server_signal_to_scale_on(tmp_path: Path) -> None:
    run = write_capacity_run(
        tmp_path / "run", RATES, GOOD, SAMPLES, saturated_first="client"
    )
    with pytest.raises(ConfigError, match="--signal queue"):
        saturation_point(run)
    assert saturation_point(run, signal="queue").found is False


def test_no_capacity_and_no_samples_are_one_line_errors(tmp_path: Path) -> None:
    none_good = write_capacity_run(tmp_path / "a", (4.0,), (False,), {})
    with pytest.raises(ConfigError, match="no rate that met the SLO"):
        saturation_point(none_good)
    unsampled = write_capacity_run(tmp_path / "b", RATES, GOOD, {1: SAMPLES[1]})
    with pytest.raises(ConfigError, match=r"no waiting sample .*stage 3"):
        saturation_point(unsampled)


def test_a_tier_uses_its_own_capacity_step(tmp_path: Path) -> None:
    tiers = [
        TierResult("strict", "ttft_p95<=0.2", 8.0, (8.0, 16.0), None, "queue", "x"),
        TierResult("batch", "ttft_p95<=2", 10.0, (10.0, 11.0), None, "kv_cache", "x"),
    ]
    met = [
        {"strict": True, "batch": True},
        {"strict": True, "batch": True},
        {"strict": False, "batch": False},
        {"strict": False, "batch": True},
        {"strict": False, "batch": False},
    ]
    run = write_capacity_run(
        tmp_path / "run", RATES, GOOD, SAMPLES, tiers=tiers, step_tiers=met
    )
    strict = saturation_point(run, tier="strict")
    assert (strict.stage, strict.value, strict.slo) == (1, 7.0, "ttft_p95<=0.2")
    batch = saturation_point(run, tier="batch")
    assert (batch.signal, batch.stage) == ("kv_cache", 3)
    assert batch.value == pytest.approx(0.35)
    with pytest.raises(ConfigError, match="strict, batch"):
        saturation_point(run, tier="gold")


#: The TTFTs of each step's requests (the SLO: ttft_p95<=0.5): steps 1 and 3
#: at 0.4 and 0.3 of its limit (the p95 of equal TTFTs), steps 2 and 4 above it
#: (3.2 and 1.2).
TTFTS = {
    0: [0.1, 0.1],
    1: [0.2, 0.2],
    2: [1.6, 1.6],
    3: [0.15, 0.15],
    4: [0.6, 0.6],
}
#: The queue through each step (after the settle): 7 at step 1, 1 at step 3 (the
#: capacity), 9 at step 2, 3 at step 4.
LEVELS = {
    1: [(2.0, [(7.0, 0.1)])],
    2: [(2.0, [(9.0, 0.9)])],
    3: [(2.0, [(1.0, 0.3)])],
    4: [(2.0, [(3.0, 0.6)])],
}


def test_the_level_at_the_slos_limit_lies_between_the_steps_nearest_it(
    tmp_path: Path,
) -> None:
    run = write_capacity_run(tmp_path / "run", RATES, GOOD, LEVELS, ttfts=TTFTS)
    point = saturation_point(run)
    assert point.at == "limit"
    # Nearest below: step 1 (0.4 of the limit, 7 waiting), not the capacity step
    # (0.3); nearest above: step 4 (1.2, 3 waiting), not step 2 (3.2).
    assert point.below is not None
    assert point.above is not None
    assert (point.below.stage, point.below.value) == (1, 7.0)
    assert point.below.slo_ratio == pytest.approx(0.4)
    assert (point.above.stage, point.above.value) == (4, 3.0)
    assert point.above.slo_ratio == pytest.approx(1.2)
    # 7 + (3 - 7) x (1 - 0.4) / (1.2 - 0.4)
    assert point.value == pytest.approx(4.0)
    # The capacity step is still the one the run's capacity names.
    assert (point.stage, point.capacity_rps) == (3, 10.0)
    assert saturation_point(run, at="capacity").value == pytest.approx(1.0)
    per_replica = saturation_point(run, measured_replicas=2)
    assert per_replica.value == pytest.approx(2.0)


def test_without_a_step_above_the_limit_the_capacity_step_stands_in(
    tmp_path: Path,
) -> None:
    # The bad steps stopped early with the SLO still met (a queue growing).
    below = {i: [0.2, 0.2] for i in range(5)}
    run = write_capacity_run(tmp_path / "run", RATES, GOOD, LEVELS, ttfts=below)
    point = saturation_point(run)
    assert (point.at, point.value, point.below) == ("capacity", 1.0, None)
