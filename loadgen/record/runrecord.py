"""The run record, typed: what ``run.json`` and ``summary.json`` hold.

One module defines it and every reader uses it: the runner, ``merge`` and a run
rebuilt from ``requests.jsonl`` write through :func:`write_record`; ``report``,
``compare``, ``merge`` and the terminal read through :func:`read_record`, which
validates both files at the edge (one line naming the file and the field) into
these types. Fields are only ever added (``RECORD_VERSION`` counts breaking
changes); unknown fields of a newer record are ignored when read.

- :class:`RunInfo` — ``run.json``: conditions (config with secrets redacted,
  command, versions, target, client limits, clock origin, environment) and the
  stage timeline; written at the start (``status: running``) and at the end.
- :class:`RunSummary` — ``summary.json``: per stage a :class:`StageResult` with its
  :class:`~servemon.loadgen.record.summary.Summary`, the overall summary, the SLO and,
  for a capacity search, its :class:`CapacityResult`.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

import pydantic

from servemon.core.errors import ConfigError, RecordError
from servemon.core.slo import SloTerm, parse_slo
from servemon.loadgen.record.findings import (
    CapacityResult,
    ClientLimit,
    ControlResult,
    StepVerdict,
    TierResult,
)
from servemon.loadgen.record.fleet import FleetRecord
from servemon.loadgen.record.sections import (
    ClientRecord,
    ClockOrigin,
    EnergyRecord,
    EnvironmentRecord,
    MergedShard,
    ServerMetricsSection,
    TargetRecord,
    WorkloadRecord,
    WorkloadSection,
    as_json,
)
from servemon.loadgen.record.summary import Summarizer, Summary, flat_row

__all__ = [
    "RECORD_VERSION",
    "CapacityResult",
    "ClientLimit",
    "ControlResult",
    "RunInfo",
    "RunResult",
    "RunSummary",
    "StageResult",
    "StepVerdict",
    "TierResult",
    "parallel_label",
    "rate_label",
    "read_record",
    "write_json",
    "write_record",
]

RECORD_VERSION = 1
T = TypeVar("T")
_LENIENT = pydantic.ConfigDict(extra="ignore")


def rate_label(rate: float, unit: str = "rps") -> str:
    """A load level by its rate, as every table, plot and comparison names it."""
    return f"{rate:g} {unit}"


def parallel_label(parallel: int | None, *, users: bool = False) -> str:
    """A closed-loop level by its concurrency (a sessions sweep's: its users)."""
    return f"{parallel} users" if users else f"parallel {parallel}"


@dataclass(slots=True)
class StageResult:
    """One stage (ramp, capacity step) or level (sweep): its plan, what happened,
    and (in ``summary.json``) its summary. Times are seconds since the run's
    clock origin."""

    __pydantic_config__ = _LENIENT

    stage: int
    label: str
    target_rate: float | None = None
    parallel: int | None = None
    planned_s: float | None = None
    start_s: float | None = None
    end_s: float | None = None
    sent: int = 0
    held_back: int = 0
    skipped: int = 0
    achieved_rate: float | None = None
    summary: Summary | None = None
    client_limits: list[ClientLimit] = field(default_factory=list)
    #: Sessions started (sessions workloads; ``sent`` counts their turns) and
    #: those cut short.
    sessions: int | None = None
    sessions_cut: int | None = None
    #: Which run of its level this stage is (1..N), with ``--repeats N`` > 1.
    repeat: int | None = None
    #: The share of prompt tokens the server's prefix cache served over the
    #: stage, by its own counters (hits over queries); None where it counts none.
    server_hit_rate: float | None = None

    @property
    def load_label(self) -> str:
        """The offered load: ``4 rps``, ``parallel 8``, ``4 sessions/s`` or
        ``8 users``."""
        if self.target_rate:
            unit = "sessions/s" if self.sessions is not None else "rps"
            return rate_label(self.target_rate, unit)
        return parallel_label(self.parallel, users=self.sessions is not None)

    def to_json(self, *, with_summary: bool = True) -> dict[str, object]:
        """The JSON form (``run.json`` keeps stages without their summaries)."""
        data: dict[str, object] = {f.name: getattr(self, f.name) for f in fields(self)}
        data["client_limits"] = [asdict(x) for x in self.client_limits]
        del data["summary"]
        if with_summary:
            summary = self.summary
            data["summary"] = None if summary is None else summary.to_json()
        return data


@dataclass(slots=True)
class RunSummary:
    """``summary.json``."""

    __pydantic_config__ = _LENIENT

    kind: str
    status: str
    stages: list[StageResult]
    overall: Summary
    slo: list[str] = field(default_factory=list)
    stop_reason: str | None = None
    capacity: CapacityResult | None = None
    control: ControlResult | None = None
    merged_from: list[str] | None = None
    rebuilt_from: str | None = None
    #: The run's requests by a conversation's turn index (sessions workloads)
    #: and by the model of a ``--model`` mix: keys are the turn (``"1"``...) or
    #: the model's name.
    by_turn: dict[str, Summary] | None = None
    by_model: dict[str, Summary] | None = None
    #: With ``--repeats``: each level's repeats pooled (key: the level's label;
    #: throughput over the repeats' durations summed). The stages keep each
    #: repeat's own summary, whose spread the report shows beside these.
    by_level: dict[str, Summary] | None = None

    @property
    def summaries(self) -> list[Summary]:
        """Each stage's summary (an empty one where a stage has none)."""
        return [s.summary or _EMPTY for s in self.stages]

    def to_json(self) -> dict[str, object]:
        """The JSON form."""
        data: dict[str, object] = {
            "kind": self.kind,
            "status": self.status,
            "stages": [s.to_json() for s in self.stages],
            "overall": self.overall.to_json(),
            "slo": self.slo,
            "stop_reason": self.stop_reason,
            "capacity": None if self.capacity is None else self.capacity.to_json(),
        }
        if self.control is not None:
            data["control"] = self.control.to_json()
        for key in ("merged_from", "rebuilt_from"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        for key in ("by_turn", "by_model", "by_level"):
            groups = getattr(self, key)
            if groups is not None:
                data[key] = {k: v.to_json() for k, v in groups.items()}
        return data

    def csv_rows(self) -> list[dict[str, object]]:
        """``summary.csv``: one flat row per stage, then ``all``."""
        rows = []
        for stage in self.stages:
            meta = stage.to_json(with_summary=False)
            meta.pop("label")
            meta["client_limits"] = " ".join(x.reason for x in stage.client_limits)
            rows.append({**meta, **flat_row(stage.summary or _EMPTY)})
        rows.append({"stage": "all", **flat_row(self.overall)})
        for key, name in (
            ("by_level", "level"),
            ("by_turn", "turn"),
            ("by_model", "model"),
        ):
            for value, summary in (getattr(self, key) or {}).items():
                rows.append({"stage": f"{name} {value}", **flat_row(summary)})
        return rows


_EMPTY = Summarizer().summary()


@dataclass(slots=True)
class RunInfo:
    """``run.json``. Its sections are typed (:mod:`servemon.loadgen.record.sections`);
    ``config`` stays a mapping: it records the flags as given."""

    __pydantic_config__ = _LENIENT

    kind: str
    status: str
    clock_origin: ClockOrigin
    record_version: int = RECORD_VERSION
    servemon_version: str = "unknown"
    command: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    target: TargetRecord = field(default_factory=TargetRecord)
    workload: WorkloadSection = field(default_factory=WorkloadRecord)
    client: ClientRecord = field(default_factory=ClientRecord)
    arrival: str | None = None
    #: The SLO's terms, structured: what a reader judges by. ``run.json`` also
    #: keeps them as text (``slo``, :attr:`slo`), derived from these; a record
    #: from before ``slo_terms`` has the text alone, parsed when read.
    slo_terms: list[SloTerm] = field(default_factory=list)
    environment: EnvironmentRecord = field(default_factory=EnvironmentRecord)
    engine_version: str = "none"
    stages: list[StageResult] = field(default_factory=list)
    stop_reason: str | None = None
    shard: str | None = None
    start_at: str | None = None
    start_late_s: float | None = None
    ended_utc: str | None = None
    #: None until the run's end (and in a record of a run killed before it).
    server_metrics: ServerMetricsSection | None = None
    #: None in a record from before it.
    energy: EnergyRecord | None = None
    merged_from: list[MergedShard] | None = None
    #: The workers that sent the run, where a fleet did (:mod:`servemon.loadgen.fleet`).
    fleet: FleetRecord | None = None

    @property
    def origin_s(self) -> float:
        """The monotonic time of the run's start (request times are absolute)."""
        return self.clock_origin.monotonic_s

    @property
    def engine_info(self) -> dict[str, str]:
        """The target's ``servemon_engine_info`` labels, if it had a ``/metrics``."""
        return dict((self.server_metrics and self.server_metrics.engine_info) or {})

    @property
    def slo(self) -> list[str]:
        """The SLO as text (``ttft_p95<=0.5``), one entry a term."""
        return [str(t) for t in self.slo_terms]

    def terms(self) -> list[SloTerm]:
        """The SLO's terms."""
        return list(self.slo_terms)

    def to_json(self) -> dict[str, object]:
        """The JSON form (stages without summaries)."""
        data: dict[str, object] = {}
        for f in fields(self):
            if f.name == "slo_terms":
                data["slo"] = self.slo
            data[f.name] = (
                [s.to_json(with_summary=False) for s in self.stages]
                if f.name == "stages"
                else as_json(getattr(self, f.name))
            )
        return data


def _info_input(path: Path, data: dict[str, object]) -> dict[str, object]:
    """A record from before ``slo_terms`` keeps the SLO as text: its terms are
    parsed from it."""
    text = data.get("slo")
    if data.get("slo_terms") or not isinstance(text, list) or not text:
        return data
    try:
        terms = parse_slo(",".join(str(t) for t in text))
    except ConfigError as exc:
        raise ConfigError(f"{path}: slo: {exc}") from None
    return {**data, "slo_terms": [asdict(t) for t in terms]}


def write_json(path: Path, data: Mapping[str, object]) -> None:
    """Write ``data`` as JSON atomically (a reader never sees half a file); a
    failed write is a one-line :class:`RecordError` and leaves no ``.tmp``."""
    tmp = path.with_name(path.name + ".tmp")
    text = json.dumps(data, indent=2, default=str) + "\n"
    with _writing(path, tmp):
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)


@contextlib.contextmanager
def _writing(path: Path, tmp: Path) -> Iterator[None]:
    """An OSError inside becomes a RecordError naming ``path``; ``tmp`` goes."""
    try:
        yield
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise RecordError(f"cannot write {path}: {exc.strerror or exc}") from None


def write_record(
    run_dir: Path, info: RunInfo, summary: RunSummary | None = None
) -> None:
    """Write ``run.json`` and, when given, ``summary.json`` and ``summary.csv``:
    the one writer of a run's record."""
    if summary is not None:
        write_json(run_dir / "summary.json", summary.to_json())
        rows = summary.csv_rows()
        columns: list[str] = []
        for row in rows:
            columns += [key for key in row if key not in columns]
        tmp = run_dir / "summary.csv.tmp"
        with _writing(run_dir / "summary.csv", tmp):
            with tmp.open("w", encoding="utf-8", newline="") as handle:
                writer = csv.DictWriter(handle, fieldnames=columns)
                writer.writeheader()
                writer.writerows(rows)
            os.replace(tmp, run_dir / "summary.csv")
    write_json(run_dir / "run.json", info.to_json())


def _read(path: Path, cls: type[T]) -> T:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: missing: is this a servemon run directory?"
        ) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: line {exc.lineno}: not valid JSON") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    if cls is RunSummary:
        data = _summary_input(data)
    if cls is RunInfo:
        data = _info_input(path, data)
    try:
        return pydantic.TypeAdapter(cls).validate_python(data)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise ConfigError(f"{path}: {where}: {first['msg']}") from None


def _summary_input(data: dict[str, object]) -> dict[str, object]:
    """Figures sit at the top level of a summary in JSON; the type keeps them in
    ``figures``."""

    def one(item: object) -> object:
        return Summary.from_json(item) if isinstance(item, dict) else item

    stages = data.get("stages")
    if isinstance(stages, list):
        stages = [
            {**s, "summary": one(s.get("summary"))} if isinstance(s, dict) else s
            for s in stages
        ]
    out = {**data, "stages": stages, "overall": one(data.get("overall"))}
    for key in ("by_turn", "by_model", "by_level"):
        groups = data.get(key)
        if isinstance(groups, dict):
            out[key] = {k: one(v) for k, v in groups.items()}
    return out


def read_info(run_dir: Path) -> RunInfo:
    """``run.json`` of ``run_dir``, validated."""
    return _read(run_dir / "run.json", RunInfo)


def read_record(run_dir: Path) -> tuple[RunInfo, RunSummary | None]:
    """``run.json`` and ``summary.json`` (None if the run never wrote it)."""
    info = read_info(run_dir)
    if not (run_dir / "summary.json").exists():
        return info, None
    return info, _read(run_dir / "summary.json", RunSummary)


@dataclass(frozen=True, slots=True)
class RunResult:
    """Where the run went and what it recorded."""

    path: Path
    info: RunInfo
    record: RunSummary

    @property
    def status(self) -> str:
        """``completed``, ``interrupted``, ``aborted`` or ``failed``."""
        return self.record.status

    @property
    def stop_reason(self) -> str | None:
        """Why a guard rail stopped the run, if one did."""
        return self.record.stop_reason

    @property
    def capacity(self) -> CapacityResult | None:
        """What a capacity search found."""
        return self.record.capacity

    @property
    def stages(self) -> list[StageResult]:
        """Every stage or level as it ran, with its summary."""
        return self.record.stages

    @property
    def summaries(self) -> list[Summary]:
        """Each stage's summary."""
        return self.record.summaries

    @property
    def overall(self) -> Summary:
        """The whole run's summary."""
        return self.record.overall
