"""What a run shows while it runs: stage, target vs achieved rate, in flight, p95
TTFT, errors.

On a terminal a live table is redrawn twice a second (rich); elsewhere (CI, a pipe)
one line is printed as each stage ends, so logs stay readable.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from rich.console import Console
from rich.live import Live
from rich.table import Table

from servemon.core.outcomes import failed
from servemon.loadgen.record.figures import exact_quantile
from servemon.loadgen.run.stages import StageRecord
from servemon.loadgen.send.timing import Outcome, RequestTiming

__all__ = ["InFlight", "Progress"]


class InFlight(Protocol):
    """What sends a schedule, as the display follows it."""

    @property
    def in_flight(self) -> int:
        """Requests started and not finished."""
        ...


class Progress:
    """Live progress of one run."""

    def __init__(self, console: Console, *, live: bool | None = None) -> None:
        self.console = console
        self.live_mode = console.is_terminal if live is None else live
        self.open_loop: InFlight | None = None
        self._stages: Sequence[StageRecord] = ()
        self._current = -1
        self._sent_times: deque[float] = deque(maxlen=10_000)
        self._ttfts: deque[float] = deque(maxlen=500)
        self._errors = 0
        self._done = 0
        #: (finished, ok, failed) per stage: what the line printed at a stage's end
        #: says (the rest were cancelled: neither ok nor failed).
        self._per_stage: dict[int, list[int]] = {}
        self._in_flight_closed = 0
        self._live: Live | None = None
        #: The stages are not known up front (a capacity search adds them).
        self.growing = False

    @property
    def current(self) -> int:
        """The index of the stage running (-1 before the first)."""
        return self._current

    def start(self, stages: Sequence[StageRecord]) -> None:
        """The run begins."""
        self._stages = stages
        if self.live_mode:
            self._live = Live(
                self._table(),
                console=self.console,
                refresh_per_second=2,
                get_renderable=self._table,
                transient=True,
            )
            self._live.start()

    def stage_started(self, index: int) -> None:
        """A stage or level begins."""
        if self._current >= 0 and not self.live_mode:
            self._print_stage(self._current)
        self._current = index
        self._ttfts.clear()

    def request_done(self, timing: RequestTiming) -> None:
        """A request finished."""
        self._done += 1
        self._sent_times.append(timing.sent_s)
        counts = self._per_stage.setdefault(timing.stage, [0, 0, 0])
        counts[0] += 1
        counts[1] += timing.outcome is Outcome.OK
        counts[2] += failed(timing.outcome)
        self._errors += failed(timing.outcome)
        if timing.outcome is Outcome.OK and timing.ttft is not None:
            self._ttfts.append(timing.ttft)

    def requests_done(
        self,
        stage: int,
        sent: Sequence[float],
        ok: int,
        failures: int,
        ttfts: Sequence[float],
    ) -> None:
        """Requests of ``stage`` finished, a batch at once: their send times, how
        many were ok and failed, the ok ones' TTFTs."""
        self._done += len(sent)
        self._sent_times.extend(sent)
        counts = self._per_stage.setdefault(stage, [0, 0, 0])
        counts[0] += len(sent)
        counts[1] += ok
        counts[2] += failures
        self._errors += failures
        self._ttfts.extend(ttfts)

    def stop(self) -> None:
        """The run ended."""
        if self._live is not None:
            self._live.stop()
            self._live = None
        elif self._current >= 0:
            self._print_stage(self._current)

    def _achieved(self, window: float = 5.0) -> float:
        now = time.monotonic()
        recent = [t for t in self._sent_times if now - t <= window]
        return len(recent) / window

    def _p95(self) -> float | None:
        if not self._ttfts:
            return None
        return exact_quantile(sorted(self._ttfts), 0.95)

    def _table(self) -> Table:
        table = Table(title="servemon: running", title_justify="left")
        for column in (
            "stage",
            "target",
            "achieved",
            "in flight",
            "done",
            "errors",
            "TTFT p95",
        ):
            table.add_column(column, justify="right")
        stage = self._stages[self._current] if self._current >= 0 else None
        in_flight = self.open_loop.in_flight if self.open_loop is not None else "-"
        p95 = self._p95()
        table.add_row(
            "-"
            if stage is None
            else f"{stage.index + 1}"
            + ("" if self.growing else f"/{len(self._stages)}"),
            "-" if stage is None else stage.label,
            f"{self._achieved():.1f} rps",
            str(in_flight),
            str(self._done),
            str(self._errors),
            "-" if p95 is None else f"{p95 * 1000:.0f} ms",
        )
        return table

    def _print_stage(self, index: int) -> None:
        stage = self._stages[index]
        finished, ok, errors = self._per_stage.get(index, (0, 0, 0))
        cancelled = finished - ok - errors
        p95 = self._p95()
        total = "" if self.growing else f"/{len(self._stages)}"
        self.console.print(
            f"stage {index + 1}{total} ({stage.label}): "
            f"{finished} finished, {ok} ok, "
            f"{errors} errors"
            + (f", {cancelled} cancelled" if cancelled else "")
            + ("" if p95 is None else f", TTFT p95 {p95 * 1000:.0f} ms"),
            soft_wrap=True,
        )
