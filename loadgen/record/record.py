"""The run directory: what a load run leaves behind, readable however it ended.

::

    RUN_DIR/
      run.json             config (secrets redacted), command line, versions, target,
                           client limits, clock origin, stage timeline, status
      requests.jsonl       one line per finished request, appended and flushed as it
                           finishes (a kill -9 leaves it valid up to the last line)
      server_metrics.jsonl the target's /metrics, sampled (see loadgen.run.sampler), or
                           the signals read from Prometheus (loadgen.run.promsource)
      control.jsonl        servemon control: one line per control tick
      summary.json         per stage or level, and overall
      summary.csv          the same, one row per stage, flat

A full disk (or any failed write) never cuts a line: a line is written whole or
not at all (a partial write is truncated away), the first failure is kept as
:attr:`RunDirectory.failure` and nothing more is appended, so that the run can stop
with that reason and every line already written stays readable.

``run.json`` is written at the start (``status: running``) and rewritten at the end,
``run.json`` and the summaries through
:func:`servemon.loadgen.record.runrecord.write_record`. The format of a
``requests.jsonl`` line is documented in ``docs/metrics.md`` and is stable: fields are
only ever added. Readers go through it in one pass (:func:`read_jsonl`), never holding
it whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from servemon.core.errors import RecordError
from servemon.loadgen.record.energy import EnergyCounters, Window
from servemon.loadgen.record.findings import ControlResult
from servemon.loadgen.record.line import request_line, timing_from_line
from servemon.loadgen.record.reading import Reading, reading_of
from servemon.loadgen.record.runrecord import (
    RunInfo,
    RunResult,
    RunSummary,
    StageResult,
    read_record,
    write_record,
)
from servemon.loadgen.record.sections import ClockOrigin
from servemon.loadgen.record.tally import Tally, with_energy, with_hit_rates
from servemon.loadgen.send.timing import RequestTiming

__all__ = [
    "UNFINISHED",
    "RunDirectory",
    "encode_line",
    "read_jsonl",
    "read_run",
    "rebuild_summary",
]


def write_failed(path: Path, exc: OSError) -> str:
    """One line saying which file could not be written and why."""
    return f"cannot write {path}: {exc.strerror or exc}"


class _Lines:
    """An append-only file of lines, each written whole or not at all."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._end = 0  # where the last whole line ends (this is the one writer)

    def open(self) -> int:
        if self._fd is None:
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
            self._fd = os.open(self.path, flags, 0o644)
            self._end = os.fstat(self._fd).st_size
        return self._fd

    def append(self, line: bytes) -> None:
        """Write ``line`` unbuffered (in the OS when this returns); on an OSError,
        truncate what part of it got written, then raise."""
        fd = self.open()
        view = memoryview(line)
        try:
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            with contextlib.suppress(OSError):  # else a reader skips the cut line
                os.ftruncate(fd, self._end)
            raise
        self._end += len(line)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class RunDirectory:
    """Creates and fills one run directory."""

    def __init__(self, path: Path) -> None:
        try:
            path.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            raise
        except OSError as exc:
            raise RecordError(write_failed(path, exc)) from None
        self.path = path
        #: The monotonic time of the run's start; stage times in run.json are
        #: offsets from it, request times in requests.jsonl are absolute.
        self.origin_s = time.monotonic()
        self.clock_origin = ClockOrigin(
            self.origin_s, datetime.now(UTC).isoformat(timespec="milliseconds")
        )
        self._requests = _Lines(path / "requests.jsonl")
        self._server = _Lines(path / "server_metrics.jsonl")
        self._control = _Lines(path / "control.jsonl")
        #: The first failed write, in one line (then nothing more is appended).
        self.failure: str | None = None
        try:
            self._requests.open()  # created now: a run has one from its start
        except OSError as exc:
            raise RecordError(write_failed(self._requests.path, exc)) from None

    @classmethod
    def create(cls, parent: Path, kind: str) -> RunDirectory:
        """A new directory ``parent/YYYYmmdd-HHMMSS-KIND[-n]``."""
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        for n in range(1000):
            name = f"{stamp}-{kind}" + (f"-{n}" if n else "")
            try:
                return cls(parent / name)
            except FileExistsError:
                continue  # another run (a shard) took it a moment ago
        raise FileExistsError(f"{parent}: too many runs named {stamp}-{kind}")

    def _append(self, lines: _Lines, line: bytes) -> None:
        if self.failure is not None:
            return
        try:
            lines.append(line)
        except OSError as exc:
            self.failure = write_failed(lines.path, exc)

    def append_request(self, timing: RequestTiming) -> None:
        """Append one finished request, handed to the OS before this returns."""
        self._append(self._requests, encode_line(request_line(timing)))

    def append_request_lines(self, lines: bytes) -> None:
        """Append finished requests' lines as they are (each with its newline),
        handed to the OS before this returns."""
        self._append(self._requests, lines)

    def append_server_sample(self, sample: Mapping[str, object]) -> None:
        """Append one sample of the target's metrics."""
        line = json.dumps(sample, separators=(",", ":")) + "\n"
        self._append(self._server, line.encode())

    def append_control(self, tick: Mapping[str, object]) -> None:
        """Append one tick of ``servemon control`` to ``control.jsonl``."""
        line = json.dumps(tick, separators=(",", ":")) + "\n"
        self._append(self._control, line.encode())

    def check(self) -> None:
        """Raise :class:`RecordError` if a write has failed."""
        if self.failure is not None:
            raise RecordError(self.failure)

    def close(self) -> None:
        """Close the open files."""
        for lines in (self._requests, self._server, self._control):
            lines.close()


def encode_line(data: Mapping[str, object]) -> bytes:
    """One JSON line, compact, with its newline: orjson, measured at 3.2 µs for a
    64-chunk request's line against 68 µs for the standard library (which it
    matches character for character on these lines). A string orjson refuses (a
    lone surrogate, as a server's JSON escapes can produce) falls back to the
    standard library, which escapes it: nothing from the network stops a record."""
    try:
        return orjson.dumps(data, option=orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:
        return (json.dumps(data, separators=(",", ":")) + "\n").encode("ascii")


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The objects of a JSON-lines file, one at a time; a line cut by a kill (or
    anything not an object) is skipped, everything before it kept."""
    if not path.exists():
        return
    with path.open("rb") as handle:  # decoded per line: a cut may split a character
        for line in handle:
            try:
                item = json.loads(line)
            except (ValueError, RecursionError):  # UnicodeDecodeError too
                continue
            if isinstance(item, dict):
                yield item


#: What a rebuilt summary says of the run.
UNFINISHED = (
    "the run did not finish (killed or crashed): its summary was rebuilt from "
    "requests.jsonl"
)


def rebuild_summary(run_dir: Path, info: RunInfo) -> RunSummary:
    """``summary.json`` for a run that never wrote it, from one pass over its
    ``requests.jsonl`` and one over its ``server_metrics.jsonl``.

    Stages are the ones ``run.json`` planned plus any a request names; throughput
    divides by the span of each stage's requests, since how far a stage got is
    not known. A stage's window (for the server's prefix-cache hit rate and the
    GPUs' energy, read from the samples the run kept as a finished run reads
    them) runs from its first request's scheduled time to the next stage's, the
    last one's to its last request's end. A control run's section comes back
    from ``control.jsonl``. The status is ``unfinished``.
    """
    slo = info.terms()
    tally = Tally(slo)
    sent: dict[int, int] = {}
    spans: dict[int, tuple[float, float]] = {}
    for line in read_jsonl(run_dir / "requests.jsonl"):
        try:
            timing = timing_from_line(line)
        except (KeyError, TypeError, ValueError):
            continue  # not a request line servemon wrote: skipped, not fatal
        tally.add(timing)
        sent[timing.stage] = sent.get(timing.stage, 0) + 1
        first, last = spans.get(timing.stage, (timing.scheduled_s, timing.end_s))
        spans[timing.stage] = (
            min(first, timing.scheduled_s),
            max(last, timing.end_s),
        )
    planned = {s.stage: s for s in info.stages}
    indices = sorted(set(planned) | set(sent))
    stages = [
        StageResult(
            stage=i,
            label=planned[i].label if i in planned else f"stage {i + 1}",
            target_rate=planned[i].target_rate if i in planned else None,
            parallel=planned[i].parallel if i in planned else None,
            planned_s=planned[i].planned_s if i in planned else None,
            start_s=planned[i].start_s if i in planned else None,
            sent=sent.get(i, 0),
            repeat=planned[i].repeat if i in planned else None,
        )
        for i in indices
    ]
    durations: list[float | None] = [None] * len(stages)
    results, overall = tally.results(stages, durations)
    windows = _windows(indices, spans)
    counted: list[Reading] = []  # the prefix cache's counters; the lines are big

    def energy_lines() -> Iterator[Mapping[str, object]]:
        """The energy lines, the readings with the cache's counters kept aside:
        one pass over a file that holds every sample of the run."""
        for line in read_jsonl(run_dir / "server_metrics.jsonl"):
            if "energy" in line:
                yield line
            elif (reading := _reading(line)) and reading.prefix_queries is not None:
                counted.append(reading)

    interval = _number(info.config, "sample_interval", 1.0) or 1.0
    energy = EnergyCounters.from_lines(energy_lines(), interval)
    results = with_hit_rates(counted, windows, results)
    if energy is not None:
        prices = (
            _number(info.config, "gpu_hour_cost", None),
            _number(info.config, "node_hour_cost", None),
        )
        results, overall = with_energy(energy, windows, results, overall, prices)
    return RunSummary(
        kind=info.kind,
        status="unfinished",
        stages=results,
        overall=overall,
        slo=[str(t) for t in slo],
        stop_reason=UNFINISHED,
        rebuilt_from="requests.jsonl",
        control=_rebuilt_control(run_dir, info),
        **tally.groups(stages, durations),
    )


def _windows(
    indices: list[int], spans: Mapping[int, tuple[float, float]]
) -> list[Window]:
    """Each stage's window from its requests (see :func:`rebuild_summary`)."""
    out: list[Window] = []
    for n, i in enumerate(indices):
        span = spans.get(i)
        if span is None:
            out.append((None, None))
            continue
        later = [spans[j][0] for j in indices[n + 1 :] if j in spans]
        out.append((span[0], later[0] if later else span[1]))
    return out


def _reading(line: Mapping[str, object]) -> Reading | None:
    """A sample line's reading; None for one servemon did not write."""
    try:
        return reading_of(line)
    except (KeyError, TypeError, ValueError):
        return None


def _number(
    config: Mapping[str, object], key: str, default: float | None
) -> float | None:
    """A number the run's recorded config holds, else ``default``."""
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return default
    try:
        return float(value)
    except ValueError:
        return default


def _rebuilt_control(run_dir: Path, info: RunInfo) -> ControlResult | None:
    """What a killed ``servemon control`` held, from its ``control.jsonl``."""
    ticks = [
        t
        for t in read_jsonl(run_dir / "control.jsonl")
        if isinstance(t.get("t_s"), int | float) and "signal" in t and "setpoint" in t
    ]
    source = "prometheus" if info.config.get("prometheus") else "direct"
    duration = info.config.get("duration")
    if not isinstance(duration, int | float):
        duration = ticks[-1]["t_s"] if ticks else 0.0
    try:
        return ControlResult.from_ticks(ticks, float(duration), source)
    except (KeyError, TypeError, ValueError):
        return None  # not ticks servemon wrote: the summary goes without


def read_run(path: Path) -> RunResult:
    """A run directory, read: what every reader of a finished, killed or merged
    run uses (report, compare, merge, the workers' merged run). One-line
    :class:`~servemon.core.errors.ConfigError` if it is not one. A run that never wrote
    ``summary.json`` (killed, crashed) gets one rebuilt from ``requests.jsonl`` and
    written beside it, and its status says it did not finish."""
    info, summary = read_record(path)
    if summary is None:
        summary = rebuild_summary(path, info)
        # Kept for the next reader; a directory that cannot take it (a full disk)
        # is still read.
        with contextlib.suppress(RecordError):
            write_record(path, info, summary)
    if summary.status == "unfinished":
        info = replace(info, status=f"unfinished: {UNFINISHED}")
    return RunResult(path, info, summary)
