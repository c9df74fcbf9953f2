"""A capacity search over several SLO tiers: one search, strictest tier first, every
step judged against every tier and none measured twice; and the tiers themselves,
read from ``--slo`` flags and YAML, checked at the edge."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pydantic
import pytest

from servemon.core.errors import ConfigError
from servemon.core.fields import layer_config
from servemon.core.slo import SloTier, parse_slo, parse_tiers
from servemon.loadgen.drivers.tiersearch import TierSearch
from servemon.loadgen.record.findings import CapacityResult, TierResult
from servemon.loadgen.run.config import LoadConfig
from servemon.loadgen.run.flat import config_of, config_text
from servemon.loadgen.run.plan import make_plan


def search(
    capacities: Mapping[str, float],
    *,
    rps_min: float = 0.5,
    rps_max: float = 10_000.0,
    precision: float = 0.05,
) -> tuple[TierSearch, list[float]]:
    """Run the search on a fake judge: a step meets a tier up to its capacity."""
    found = TierSearch(list(capacities), rps_min, rps_max, precision)
    rates = []
    while (rate := found.next_rate()) is not None:
        rates.append(rate)
        found.add(rate, {tier: rate <= cap for tier, cap in capacities.items()})
    return found, rates


def test_one_slo_doubles_then_bisects_between_last_good_and_first_bad() -> None:
    found, rates = search({"": 6.3})
    assert rates == [0.5, 1.0, 2.0, 4.0, 8.0, 6.0, 7.0, 6.5, 6.25]
    assert found.bracket("") == (6.25, 6.5)
    assert found.settled("") == "precision reached"


def test_two_tiers_share_their_steps_strictest_first() -> None:
    capacities = {"batch": 23.7, "interactive": 6.3}
    found, rates = search(capacities)
    # Doubling to the first break, interactive's bisection, then the doubling
    # carried on from 8 req/s for batch: the steps below 8 are never sent again.
    assert rates == [0.5, 1, 2, 4, 8, 6, 7, 6.5, 6.25, 16, 32, 24, 20, 22, 23]
    assert len(set(rates)) == len(rates)
    assert found.ranked() == ["interactive", "batch"]
    assert found.bracket("interactive") == (6.25, 6.5)
    assert found.bracket("batch") == (23.0, 24.0)
    apart = sum(len(search({t: c})[1]) for t, c in capacities.items())
    assert (len(rates), apart) == (15, 20)


@pytest.mark.parametrize(
    ("strict", "loose"), [(0.7, 1.3), (3.0, 3.05), (5.0, 90.0), (40.0, 41.0)]
)
def test_no_rate_twice_and_never_more_steps_than_two_searches(
    strict: float, loose: float
) -> None:
    found, rates = search({"a": strict, "b": loose})
    assert len(set(rates)) == len(rates)
    one = search({"a": strict})[0].bracket("a")
    two = search({"b": loose})[0].bracket("b")
    assert found.bracket("a") == one
    assert found.bracket("b")[1] is not None
    assert found.bracket("b")[0] <= loose < found.bracket("b")[1]  # type: ignore[operator]
    assert two[0] <= loose < two[1]  # type: ignore[operator]
    apart = len(search({"a": strict})[1]) + len(search({"b": loose})[1])
    assert len(rates) < apart


def test_a_tier_broken_at_rps_min_and_one_met_at_rps_max_are_settled() -> None:
    found, rates = search({"tight": 0.1, "loose": 1e6}, rps_max=8.0)
    assert rates == [0.5, 1.0, 2.0, 4.0, 8.0]
    assert found.bracket("tight") == (None, 0.5)
    assert found.settled("tight") == "the SLO breaks already at --rps-min"
    assert found.settled("loose") == "--rps-max reached with the SLO still met"


def test_a_rate_measured_again_is_refused() -> None:
    found = TierSearch(["a"], 1.0, 8.0, 0.05)
    found.add(1.0, {"a": True})
    with pytest.raises(ValueError, match="measured already"):
        found.add(1.0, {"a": True})


def test_named_tiers_parse_from_flags_and_yaml(tmp_path: Path) -> None:
    flags = ("interactive=ttft_p95<=0.3,itl_p95<=0.05", "batch=e2e_p95<=30")
    config = LoadConfig(slo=flags)  # type: ignore[arg-type]
    assert [str(t) for t in config.slo] == list(flags)
    assert config.slo_terms == tuple(parse_slo("ttft_p95<=0.3,itl_p95<=0.05"))
    assert config_text(config)["slo"] == list(flags)
    yaml = tmp_path / "capacity.yaml"
    yaml.write_text("slo:\n  interactive: ttft_p95<=0.3\n  batch: e2e_p95<=30\n")
    from_yaml = layer_config(LoadConfig, yaml, {})
    assert [t.name for t in from_yaml.slo] == ["interactive", "batch"]


def test_one_plain_slo_is_one_unnamed_tier_as_before() -> None:
    config = LoadConfig(slo="ttft_p95<=0.5")  # type: ignore[arg-type]
    assert config.slo == (SloTier("", tuple(parse_slo("ttft_p95<=0.5"))),)
    assert config_text(config)["slo"] == "ttft_p95<=0.5"
    flag = LoadConfig(slo=("ttft_p95<=0.5",))  # type: ignore[arg-type]
    assert flag.slo == config.slo


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        (
            ["a=ttft_p95<=1", "e2e_p95<=2"],
            "--slo e2e_p95<=2: several SLOs need a name each",
        ),
        (["a=ttft_p95<=1", "a=e2e_p95<=2"], "--slo a: the tier is named twice"),
        (["a=ttft_p95<=1", "batch=e2e<=2"], "--slo batch: 'e2e<=2': name a statistic"),
        (["fast=ttft_p95<=1", "slow="], "--slo slow: no terms"),
    ],
)
def test_a_bad_tier_is_one_line_naming_the_flag_and_the_tier(
    texts: list[str], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_tiers(texts)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_several_tiers_are_for_capacity_only() -> None:
    tiers = ("a=ttft_p95<=1", "b=e2e_p95<=20")
    flags = {"slo": tiers, "step_seconds": 3.0, "settle": 1.0}
    make_plan("capacity", config_of("capacity", ("flags", flags)))
    with pytest.raises(ConfigError, match=r"^--slo: several SLO tiers \(a, b\)"):
        make_plan("ramp", config_of("ramp", ("flags", {"slo": tiers})))


def test_a_record_without_tiers_reads_and_writes_as_before() -> None:
    old = {
        "capacity_rps": 4.0,
        "bracket": [4.0, 8.0],
        "first_breach": "ttft_p95<=0.5 (was 0.7)",
        "saturated_first": "queue",
        "ended_because": "precision reached",
        "steps": [{"stage": 0, "rate": 4.0, "good": True}],
    }
    found = pydantic.TypeAdapter(CapacityResult).validate_python(old)
    assert found.tiers == []
    data = found.to_json()
    assert "tiers" not in data
    assert "tiers" not in data["steps"][0]
    found.tiers = [TierResult("batch", "e2e_p95<=30", 8.0, (8.0, 9.0), None, None, "x")]
    assert found.to_json()["tiers"][0]["name"] == "batch"
