"""When a source a run reads (the server's ``/metrics``, Prometheus' signals, the
GPUs' energy counters) first answered, and after how many tries.

A source that is missing at the start (a compose stack whose Prometheus has not
scraped yet, an exporter still starting) is tried again at every sampling round;
the run record says from when it was read (``first_read_s``, on the run's clock)
and how many tries it took (``tries``: 1 where the first worked; every try where
none did)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FirstRead"]


@dataclass(slots=True)
class FirstRead:
    """The tries of one source up to its first reading."""

    #: Tries so far, up to and including the first that worked.
    tries: int = 0
    #: The monotonic time of the first reading that worked; None before it.
    at: float | None = None

    def tried(self, now: float, ok: bool) -> bool:
        """One try at ``now``; True where it is the first that worked."""
        if self.at is not None:
            return False
        self.tries += 1
        if ok:
            self.at = now
        return ok

    def first_read_s(self, origin_s: float) -> float | None:
        """When the first reading worked, in seconds since the run's origin
        (3 decimals); None if never read."""
        return None if self.at is None else round(self.at - origin_s, 3)
