"""What cuts a capacity step short from the server's own signals: its last four
readings, a second apart at least, whatever the sample interval."""

from __future__ import annotations

from servemon.loadgen.drivers.capacity import _server_signal, _spaced
from servemon.loadgen.record.reading import Reading


def queue(times: list[float], waiting: list[float]) -> list[Reading]:
    return [
        Reading(at=t, waiting=w, running=1.0, kv_cache_usage=0.1, preemptions=0.0)
        for t, w in zip(times, waiting, strict=True)
    ]


def test_a_queue_growing_for_seconds_cuts_the_step() -> None:
    window = queue([0.0, 1.0, 2.0, 3.0], [2.0, 5.0, 8.0, 11.0])
    assert _server_signal(window) == (
        "queue",
        "waiting queue growing without bound (11)",
    )


def test_four_quick_readings_rising_by_chance_do_not() -> None:
    # --sample-interval 0.25: a Poisson burst lifts four readings in 0.75 s; the
    # readings a second apart before it show a queue that comes and goes.
    times = [i * 0.25 for i in range(16)]
    waiting = [3, 2, 1, 0, 1, 2, 1, 0, 2, 1, 0, 1, 2, 4, 6, 8]
    assert _server_signal(queue(times, [float(w) for w in waiting])) is None
    # The same burst read once a second would not have been seen as growth either.
    spaced = _spaced(queue(times, [float(w) for w in waiting]), 1.0)
    assert [r.at for r in spaced] == [0.75, 1.75, 2.75, 3.75]


def test_a_queue_growing_at_a_quick_interval_still_cuts_the_step() -> None:
    times = [i * 0.25 for i in range(16)]
    waiting = [float(i) for i in range(16)]
    found = _server_signal(queue(times, waiting))
    assert found is not None
    assert found[0] == "queue"
