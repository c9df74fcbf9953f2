"""``servemon merge RUN_DIR --spool FILE...``: a fleet run with the records its
workers kept and its coordinator never wrote.

A fleet's worker appends every record it makes to its spool (``NAME.jsonl``, lines
of ``requests.jsonl`` already on the coordinator's clock). A record the coordinator
never got (it was killed, or the connection broke while the request was in flight)
is only there. Recovery writes a new run directory, beside the run by default; the
run itself is never changed:

- every line of the run's ``requests.jsonl``, except the ones a spool replaces;
- every spool line whose request id the run lacks, with ``worker`` set to the index
  of the worker the spool is named after (``run.json`` ``fleet.workers[].name``,
  written when the workers have joined), or else the index the run's own records
  of the spool's requests name (a worker that joined late);
- where the coordinator wrote a request as cancelled because it could not know how
  it ended (error ``worker N lost`` or ``cancelled``), the worker's own record of it
  in its place.

A spool is appended to by every run its worker joins, so a line is taken only if
its request id carries a prefix (the run's request tag) that the run's own lines
carry; other lines are counted as another run's. The summary is rebuilt from the
new ``requests.jsonl`` as a killed run's is (:func:`loadgen.record.record.
rebuild_summary`); a run that finished keeps its status, stop reason and capacity.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from servemon.core.errors import ConfigError
from servemon.loadgen.record.line import timing_from_line
from servemon.loadgen.record.record import RunDirectory, read_jsonl, rebuild_summary
from servemon.loadgen.record.runrecord import RunInfo, read_record, write_record
from servemon.loadgen.record.sections import MergedShard
from servemon.loadgen.reports.report import write_report
from servemon.loadgen.send.timing import Outcome, RequestTiming

__all__ = ["Recovery", "SpoolCount", "recover_spools"]

#: The errors of a record the coordinator wrote for a request whose worker never
#: answered for it (``servemon.loadgen.fleet.members.unsent``): a spool's record
#: replaces it.
_UNANSWERED = re.compile(r"cancelled|worker \d+ lost")
#: The files of a run copied as they are.
_COPIED = ("server_metrics.jsonl", "control.jsonl")


@dataclass(slots=True)
class SpoolCount:
    """What one spool gave."""

    path: Path
    #: The index of the worker that kept it (-1 until it is known).
    worker: int
    #: Requests the run lacked, appended.
    recovered: int = 0
    #: Requests the run had as cancelled for want of an answer, replaced.
    replaced: int = 0
    #: Requests the run had already (or an earlier spool line gave).
    present: int = 0
    #: Lines of other runs the worker joined (their request tag is not this run's).
    other_runs: int = 0
    #: ``FILE:LINE: why`` for each line that is not a request record.
    unreadable: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Recovery:
    """The new run directory, and what each spool gave."""

    path: Path
    spools: list[SpoolCount]


def _tag(request_id: str) -> str:
    return request_id.split("-", 1)[0]


def _named(info: RunInfo, path: Path) -> int | None:
    """The index of the worker ``run.json`` names as the spool's file is named
    (``NAME.jsonl``); None where it names none."""
    workers = [] if info.fleet is None else info.fleet.workers
    found = [w.index for w in workers if w.name == path.stem]
    if len(found) > 1:
        raise ConfigError(
            f"{path}: workers {found} share the name {path.stem!r}: which one kept "
            "this spool is not known"
        )
    return found[0] if found else None


def _worker_of(
    count: SpoolCount, named: int | None, votes: set[int | None], run_dir: Path
) -> int:
    """The spool's worker: by its name, else the one the run's records of its
    requests name (a worker that joined a killed run late)."""
    if named is not None:
        return named
    indices = {v for v in votes if v is not None}
    if len(indices) == 1:
        return indices.pop()
    raise ConfigError(
        f"{count.path}: which worker of {run_dir} kept it is not known: run.json "
        f"names no worker {count.path.stem!r} (a spool is NAME.jsonl) and "
        + (
            "none of the run's records of its requests names a worker"
            if not indices
            else f"the run's records of its requests name workers {sorted(indices)}"
        )
    )


def _spool_lines(
    path: Path, count: SpoolCount
) -> Iterator[tuple[int, str, RequestTiming]]:
    """Each request record of a spool: its line number, id and timing; a line
    that is not one is noted in ``count``."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                line = json.loads(raw)
            except (ValueError, RecursionError):
                count.unreadable.append(f"{path}:{number}: not JSON (cut by a kill?)")
                continue
            try:
                timing = timing_from_line(line)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                why = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
                count.unreadable.append(f"{path}:{number}: not a request record: {why}")
                continue
            yield number, timing.request_id, timing


def _run_lines(run_dir: Path) -> Iterator[RequestTiming]:
    for line in read_jsonl(run_dir / "requests.jsonl"):
        try:
            yield timing_from_line(line)
        except (KeyError, TypeError, ValueError, AttributeError):
            continue  # not a request line servemon wrote (a rebuild skips it too)


def _unanswered(timing: RequestTiming) -> bool:
    return timing.outcome is Outcome.CANCELLED and bool(
        _UNANSWERED.fullmatch(timing.error or "")
    )


def recover_spools(
    run_dir: Path, spools: Sequence[Path], out_parent: Path | None = None
) -> Recovery:
    """A new run directory (under ``out_parent``, by default beside ``run_dir``)
    holding the fleet run ``run_dir`` and what its workers' ``spools`` kept that it
    lacks."""
    info, summary = read_record(run_dir)
    named = [_named(info, path) for path in spools]
    counts = [SpoolCount(path, -1) for path in spools]
    # The run's request ids and the worker each names (one pass), then which
    # spool line each taken id comes from (one pass over the spools); the
    # writing passes follow.
    present: dict[str, int | None] = {}
    unanswered: set[str] = set()
    tags: set[str] = set()
    for timing in _run_lines(run_dir):
        present[timing.request_id] = timing.worker
        tags.add(_tag(timing.request_id))
        if _unanswered(timing):
            unanswered.add(timing.request_id)
    taken: dict[str, tuple[int, int]] = {}
    for n, count in enumerate(counts):
        votes: set[int | None] = set()
        for number, request_id, _timing in _spool_lines(count.path, count):
            if _tag(request_id) not in tags:
                count.other_runs += 1
                continue
            if request_id in present:
                votes.add(present[request_id])
            if request_id in taken or (
                request_id in present and request_id not in unanswered
            ):
                count.present += 1
            else:
                taken[request_id] = (n, number)
                if request_id in present:
                    count.replaced += 1
                else:
                    count.recovered += 1
        count.worker = _worker_of(count, named[n], votes, run_dir)

    parent = run_dir.parent if out_parent is None else out_parent
    rundir = RunDirectory.create(parent, "recovered")
    rundir.clock_origin = info.clock_origin  # the run's clock, not the copy's
    for timing in _run_lines(run_dir):
        if timing.request_id not in taken:
            rundir.append_request(timing)
    for n, count in enumerate(counts):
        for number, request_id, timing in _spool_lines(
            count.path, SpoolCount(count.path, count.worker)
        ):
            if taken.get(request_id) == (n, number):
                rundir.append_request(replace(timing, worker=count.worker))
    rundir.close()
    rundir.check()  # a line that could not be written (a full disk) fails it
    for name in _COPIED:
        if (run_dir / name).exists():
            shutil.copyfile(run_dir / name, rundir.path / name)

    rebuilt = rebuild_summary(rundir.path, info)
    sources = [str(run_dir), *(str(c.path) for c in counts)]
    if summary is not None:  # it finished: what it said of itself stands
        rebuilt = replace(
            rebuilt,
            status=summary.status,
            stop_reason=summary.stop_reason,
            capacity=summary.capacity,
        )
    merged = [MergedShard(path=str(run_dir), status=info.status)]
    merged += [
        MergedShard(
            path=str(c.path),
            worker=c.worker,
            recovered=c.recovered,
            replaced=c.replaced,
        )
        for c in counts
    ]
    write_record(
        rundir.path,
        replace(
            info,
            status=rebuilt.status,
            clock_origin=rundir.clock_origin,
            merged_from=merged,
        ),
        replace(rebuilt, merged_from=sources),
    )
    write_report(rundir.path)
    return Recovery(rundir.path, counts)
