"""When a capacity step read from Prometheus had too few fresh signals to judge."""

from __future__ import annotations

from servemon.loadgen.drivers.capacity import blind

FRESH = {"waiting": 0.0, "running": 3.0, "kv_cache_usage": 0.2, "preemptions": 0.0}
STALE = {"waiting": None, "running": None, "kv_cache_usage": None, "preemptions": None}


def test_a_step_with_fresh_signals_is_not_blind() -> None:
    reads = [(float(t), FRESH) for t in range(10)]
    assert blind(reads, 0.0, 9.0) is None


def test_a_step_without_an_answer_from_prometheus_is_blind() -> None:
    # Error lines are reads without signals; reads before the step do not count.
    reads = [(0.0, FRESH), (1.0, FRESH)] + [(float(t), {}) for t in range(5, 10)]
    assert blind(reads, 5.0, 9.0) == (
        "blind: 5 of 5 reads from Prometheus during the step had no fresh queue, "
        "KV-cache or preemption signal"
    )
    assert blind(reads, 20.0, 30.0) == (
        "blind: no answer from Prometheus during the step"
    )


def test_a_missing_signal_is_never_read_as_a_zero_queue() -> None:
    # Stale series (None) are missing, not zero: most of the step saw none.
    reads = [(0.0, FRESH), (1.0, STALE), (2.0, STALE), (3.0, {"running": 2.0})]
    assert blind(reads, 0.0, 3.0) is not None
    # Half the reads fresh is enough to judge on.
    assert blind([(0.0, FRESH), (1.0, STALE)], 0.0, 1.0) is None
