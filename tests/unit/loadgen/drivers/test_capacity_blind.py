"""When a capacity step read from Prometheus had too few fresh signals to judge."""

from __future__ import annotations

from typing import Any

from servemon.loadgen.drivers.capacity import blind
from servemon.loadgen.record.reading import Reading, reading_of

FRESH = {"waiting": 0.0, "running": 3.0, "kv_cache_usage": 0.2, "preemptions": 0.0}
STALE = {"waiting": None, "running": None, "kv_cache_usage": None, "preemptions": None}


def read(at: float, signals: dict[str, Any] | None) -> Reading:
    """The reading of a Prometheus line (None: an error line)."""
    line: dict[str, Any] = {"mono_s": at, "source": "prometheus"}
    if signals is None:
        line["error"] = "connection refused"
    else:
        line["signals"] = signals
    reading = reading_of(line)
    assert reading is not None
    return reading


def test_a_step_with_fresh_signals_is_not_blind() -> None:
    reads = [read(t, FRESH) for t in range(10)]
    assert blind(reads, 0.0, 9.0) is None


def test_a_step_without_an_answer_from_prometheus_is_blind() -> None:
    # Error lines are reads without signals; reads before the step do not count.
    reads = [read(0, FRESH), read(1, FRESH)] + [read(t, None) for t in range(5, 10)]
    assert blind(reads, 5.0, 9.0) == (
        "blind: 5 of 5 reads from Prometheus during the step had no fresh queue, "
        "KV-cache or preemption signal"
    )
    assert blind(reads, 20.0, 30.0) == (
        "blind: no answer from Prometheus during the step"
    )


def test_a_missing_signal_is_never_read_as_a_zero_queue() -> None:
    # Stale series (None) are missing, not zero: most of the step saw none.
    reads = [read(0, FRESH), read(1, STALE), read(2, STALE), read(3, {"running": 2.0})]
    assert blind(reads, 0.0, 3.0) is not None
    # Half the reads fresh is enough to judge on.
    assert blind([read(0, FRESH), read(1, STALE)], 0.0, 1.0) is None
