"""The decision drawn on the report's plots (:mod:`servemon.loadgen.reports.marks`):
which tiers a run has, and the SVG ids of their marks on latency against load."""

from __future__ import annotations

from servemon.core.slo import parse_slo
from servemon.loadgen.record.findings import CapacityResult, StepVerdict, TierResult
from servemon.loadgen.record.runrecord import RunInfo, RunSummary, StageResult
from servemon.loadgen.record.sections import ClockOrigin
from servemon.loadgen.record.summary import Summarizer
from servemon.loadgen.reports.marks import tiers_of
from servemon.loadgen.reports.plots import plot_vs_load


def _tier(name: str, slo: str, rate: float | None) -> TierResult:
    return TierResult(name, slo, rate, (rate, 8.0), None, None, "precision reached")


def _run(capacity: CapacityResult | None, slo: list[str]) -> tuple[RunInfo, RunSummary]:
    info = RunInfo(
        kind="capacity",
        status="completed",
        clock_origin=ClockOrigin(),
        slo_terms=parse_slo(",".join(slo)) if slo else [],
    )
    stages = [
        StageResult(
            stage=i, label=f"{r:g} rps", target_rate=r, summary=Summarizer().summary()
        )
        for i, r in enumerate((2.0, 4.0, 8.0), start=1)
    ]
    record = RunSummary(
        kind="capacity",
        status="completed",
        stages=stages,
        overall=Summarizer().summary(),
        slo=slo,
        capacity=capacity,
    )
    return info, record


def _search(*tiers: TierResult) -> CapacityResult:
    steps = [
        StepVerdict(stage=i, rate=r, good=r < 8)
        for i, r in enumerate((2.0, 4.0, 8.0), 1)
    ]
    first = tiers[0]
    return CapacityResult(
        first.capacity_rps,
        first.bracket,
        None,
        None,
        first.ended_because,
        steps,
        list(tiers),
    )


def test_each_tier_is_drawn_with_its_thresholds_and_capacity() -> None:
    info, record = _run(
        _search(
            _tier("interactive", "ttft_p95<=0.3,tpot_mean<=0.02,error_rate<=0.01", 4.0),
            _tier("batch", "e2e_p95<=30", None),
        ),
        [],
    )
    tiers = tiers_of(info, record)
    assert [(t.name, t.capacity_rps, len(t.terms)) for t in tiers] == [
        ("interactive", 4.0, 3),
        ("batch", None, 1),
    ]
    page = plot_vs_load(info, record)
    for gid in ("slo-interactive-ttft_p95", "slo-interactive-tpot_mean",
                "slo-batch-e2e_p95", "capacity-interactive"):  # fmt: skip
        assert f'id="{gid}"' in page, gid
    # A term on a figure not drawn by default brings its curve; error_rate no line;
    # a tier that met no rate has no capacity line and says so.
    assert "TPOT mean" in page
    assert "error_rate" not in page
    assert 'id="capacity-batch"' not in page
    assert "no rate met: batch" in page


def test_one_slo_is_the_tier_slo_and_a_ramp_has_no_capacity() -> None:
    search = CapacityResult(4.0, (4.0, 8.0), None, None, "precision reached", [])
    info, record = _run(search, ["ttft_p95<=0.5"])
    assert [(t.name, t.capacity_rps) for t in tiers_of(info, record)] == [("slo", 4.0)]
    info.slo_terms = list(tiers_of(info, record)[0].terms)
    record.capacity = None
    assert [(t.name, t.capacity_rps) for t in tiers_of(info, record)] == [("slo", None)]
    info.slo_terms = []
    assert tiers_of(info, record) == []
    assert 'id="slo-' not in plot_vs_load(info, record)
