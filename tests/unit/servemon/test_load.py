"""What the terminal says of a capacity search's answer."""

from __future__ import annotations

from servemon.load import capacity_lines
from servemon.loadgen.record.findings import CapacityResult, StepVerdict


def result(*steps: StepVerdict, capacity: float | None, ended: str) -> CapacityResult:
    return CapacityResult(
        capacity_rps=capacity,
        bracket=(capacity, None),
        first_breach=None,
        saturated_first=None,
        ended_because=ended,
        steps=list(steps),
    )


def test_a_search_blind_from_its_first_step_does_not_claim_the_slo_broke() -> None:
    blind = StepVerdict(0, 0.5, False, early_stop="blind: ...", blind=True)
    lines = capacity_lines(result(blind, capacity=None, ended="blind: ... at 0.5"))
    assert lines.splitlines()[0] == (
        "capacity: unknown (blind before any rate was judged good)"
    )


def test_below_rps_min_when_the_first_step_broke_the_slo() -> None:
    bad = StepVerdict(0, 0.5, False, breaches=["ttft_p95<=0.5 (was 0.9)"])
    lines = capacity_lines(result(bad, capacity=None, ended="the SLO breaks"))
    assert lines.splitlines()[0] == "capacity: below --rps-min (no rate met the SLO)"


def test_a_blind_step_after_a_good_one_keeps_the_good_rate() -> None:
    good = StepVerdict(0, 4.0, True)
    blind = StepVerdict(1, 8.0, False, early_stop="blind: ...", blind=True)
    lines = capacity_lines(result(good, blind, capacity=4.0, ended="blind at 8"))
    assert lines.splitlines()[0] == "capacity: 4 req/s meets the SLO"
