"""What ``run.json`` keeps of a run sent by a fleet of workers
(:mod:`servemon.loadgen.fleet`): each worker's clock as measured against the
coordinator's, and which share of the run it sent, from when to when."""

from __future__ import annotations

from dataclasses import dataclass, field

import pydantic

__all__ = ["FleetRecord", "WorkerRecord"]

_LENIENT = pydantic.ConfigDict(extra="ignore")


@dataclass(slots=True)
class WorkerRecord:
    """One worker: its clock, and its share's time line (seconds from the run's
    origin, on the coordinator's clock)."""

    __pydantic_config__ = _LENIENT

    index: int
    name: str
    host: str = ""
    address: str = ""
    #: The worker's clock minus the coordinator's (positive: ahead), from the
    #: exchange of smallest round trip among the last ones, and within how much.
    offset_s: float | None = None
    uncertainty_s: float | None = None
    rtt_s: float | None = None
    #: The offset as first measured, before any work (the drift is the difference).
    first_offset_s: float | None = None
    clock_samples: int = 0
    joined_s: float | None = None
    #: When it was handed the plan (work from then on), and when it stopped.
    working_s: float | None = None
    stopped_s: float | None = None
    stop_reason: str | None = None
    #: Requests handed to it, and records it sent back.
    credits: int = 0
    records: int = 0
    #: Its messages or records that did not read (skipped).
    malformed: int = 0


@dataclass(slots=True)
class FleetRecord:
    """The fleet that sent a run."""

    __pydantic_config__ = _LENIENT

    coordinator: str
    expected: int
    on_worker_loss: str = "abort"
    #: How long before its time a request was handed to its worker.
    ahead_s: float = 0.0
    #: Workers turned away (no valid token).
    refused: int = 0
    workers: list[WorkerRecord] = field(default_factory=list)
