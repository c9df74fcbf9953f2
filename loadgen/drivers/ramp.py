"""``servemon ramp``: the open-loop driver — a schedule of stages sent at the times
the seeded arrival process gives, whatever the target does
(:func:`~servemon.loadgen.drivers.openloop.open_loop`).
"""

from __future__ import annotations

from servemon.loadgen.drivers.openloop import open_loop, wait_for_start
from servemon.loadgen.run.context import Drive, Driven
from servemon.loadgen.run.sections import RampArgs
from servemon.loadgen.send.arrivals import Stage

__all__ = ["drive_ramp"]


async def drive_ramp(run: Drive[RampArgs], found: Driven) -> None:
    """Send the planned stages open loop, from ``--start-at`` or now (its section's
    ``--max-requests`` and ``--shard`` applied)."""
    plan: list[Stage] = []
    offset = 0.0
    for s in run.board.stages:
        duration = s.planned_s or 0.0
        plan.append(Stage(s.index, s.target_rate or 0.0, duration, offset))
        offset += duration
    start = await wait_for_start(run, found)
    if start is None:
        return
    found.interrupted = await open_loop(
        run,
        plan,
        seed=run.sending.seed,
        limit=run.settings.max_requests,
        shard=run.settings.shard,
        start_s=start,
    )
