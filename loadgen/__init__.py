"""The load generator: requests sent on a schedule, timed as a client waits for them.

:mod:`loadgen.runner` runs a load command through its driver — :mod:`loadgen.ramp`
(open loop: :mod:`loadgen.arrivals`, :mod:`loadgen.dispatch`), :mod:`loadgen.sweep`
(closed loop: :mod:`loadgen.closedloop`) or :mod:`loadgen.capacity` — over one
:mod:`loadgen.context`. Each request is timed by :mod:`loadgen.client` into a
:mod:`loadgen.timing` record, appended to :mod:`loadgen.record`'s run directory,
published live by :mod:`loadgen.live` and summed up as it finishes by
:mod:`loadgen.summary`; the run's typed record is :mod:`loadgen.runrecord`.
Prompts come from :mod:`loadgen.workload`.
"""

from servemon.loadgen.client import ClientSettings, send_request
from servemon.loadgen.closedloop import run_closed_loop
from servemon.loadgen.summary import Summary, summarize
from servemon.loadgen.timing import Outcome, RequestTiming, TokenSource

__all__ = [
    "ClientSettings",
    "Outcome",
    "RequestTiming",
    "Summary",
    "TokenSource",
    "run_closed_loop",
    "send_request",
    "summarize",
]
