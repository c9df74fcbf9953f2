"""``servemon replay``: a trace sent open loop at its own times.

The schedule is the trace's (:mod:`servemon.loadgen.workloads.replayplan`: scaled,
windowed, looped), one stage long; the prompts are the trace's
(:mod:`servemon.loadgen.workloads.traceprompts`). Each request goes out at its time
whatever is in flight, through the ramp's dispatcher, so dispatch lag, ``held_back`` and
the from-scheduled figures mean what they mean for a ramp. ``--shard I/N`` sends every
N-th entry (by index), so N processes given the same ``--start-at`` send the whole trace
between them.
"""

from __future__ import annotations

from servemon.loadgen.drivers.openloop import open_loop, wait_for_start
from servemon.loadgen.run.context import Drive, Driven
from servemon.loadgen.run.sections import ReplayArgs
from servemon.loadgen.send.arrivals import Due, Stage

__all__ = ["drive_replay"]


async def drive_replay(run: Drive[ReplayArgs], found: Driven) -> None:
    """Send the trace's requests at their (scaled) times, as planned with its
    section (:class:`~servemon.loadgen.run.sections.ReplayArgs`: the limit and the
    shard apply here)."""
    c = run.settings
    plan = run.replay
    if plan is None:
        raise ValueError("a replay runs on the plan made with it (make_plan)")
    sends = plan.sends[: c.max_requests] if c.max_requests else plan.sends
    shard = c.shard
    if shard is not None:  # every N-th entry, as a ramp's shards split arrivals
        sends = tuple(s for s in sends if s[0] % shard.count == shard.index)
    start = await wait_for_start(run, found)
    if start is None:
        return
    stage = Stage(0, plan.rate, plan.duration_s, 0.0)
    found.interrupted = await open_loop(
        run,
        [stage],
        seed=run.sending.seed,
        start_s=start,
        sends=(Due(index, 0, offset) for index, offset in sends),
    )
