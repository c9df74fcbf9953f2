"""What ``run.json`` keeps of a run's workload (its ``workload`` section): the
spec, where prompt lengths were counted, the target's context, and what a trace
or a ``prefix:`` workload adds (:mod:`servemon.loadgen.record.sections`)."""

from __future__ import annotations

from servemon.loadgen.record.sections import (
    PrefixRecord,
    TraceRecord,
    TraceSource,
    WorkloadRecord,
)
from servemon.loadgen.run.prefixcache import PrefixTarget
from servemon.loadgen.workloads.prefix import PrefixWorkload
from servemon.loadgen.workloads.prompts import Workload
from servemon.loadgen.workloads.traceprompts import TraceWorkload

__all__ = ["prefix_record", "trace_record", "workload_record"]


def workload_record(
    workload: Workload, context: int | None, prefix: PrefixTarget | None
) -> WorkloadRecord:
    """The record of ``workload``, built against a target of ``context`` tokens
    (a ``prefix:`` workload: on the engine's facts ``prefix``)."""
    trace = None
    if isinstance(workload, TraceWorkload):
        context, trace = workload.fit.context, trace_record(workload)
    return WorkloadRecord(
        spec=workload.spec,
        token_source=workload.token_source,
        context_tokens=context,
        trace=trace,
        prefix=prefix_record(workload, prefix),
    )


def trace_record(workload: TraceWorkload) -> TraceRecord:
    """How a trace's entries fit the target's context, the trace's format and
    the failed lines it marks (skipped or kept)."""
    source = workload.source
    return TraceRecord(
        over_context=workload.fit.policy,
        entries_over_context=workload.fit.over,
        source=None
        if source is None
        else TraceSource(source.format, source.failed, source.failed_lines),
    )


def prefix_record(
    workload: Workload, prefix: PrefixTarget | None
) -> PrefixRecord | None:
    """A ``prefix:`` workload's rate asked, its blocks' rate, and the engine's
    facts they rest on (None for another kind)."""
    if not isinstance(workload, PrefixWorkload) or prefix is None:
        return None
    return PrefixRecord(
        asked_hit=workload.asked_hit,
        expected_hit=round(workload.expected_hit, 6),
        shared_tokens=workload.shared_tokens,
        groups=workload.groups,
        block_size=prefix.block_size,
        cache_tokens=prefix.cache_tokens,
        overhead_tokens=prefix.overhead_tokens,
        tail_tokens=prefix.tail_tokens,
        block_source=prefix.block_source,
        overhead_source=prefix.overhead_source,
    )
