"""The load generator: requests sent on a schedule, timed as a client waits for them.

:mod:`loadgen.runner` runs a load command through its driver —
:mod:`loadgen.drivers.ramp` (open loop: :mod:`loadgen.send.arrivals`,
:mod:`loadgen.send.dispatch`), :mod:`loadgen.drivers.sweep` (closed loop:
:mod:`loadgen.send.closedloop`) or :mod:`loadgen.drivers.capacity` — over one
:mod:`loadgen.run.context`. Each request is timed by :mod:`loadgen.send.client` into a
:mod:`loadgen.send.timing` record, appended to :mod:`loadgen.record.record`'s run
directory, published live by :mod:`loadgen.run.live` and summed up as it finishes by
:mod:`loadgen.record.summary`; the run's typed record is
:mod:`loadgen.record.runrecord`. Prompts come from :mod:`loadgen.workloads.workload`.
"""

from servemon.loadgen.record.summary import Summary, summarize
from servemon.loadgen.send.client import ClientSettings, send_request
from servemon.loadgen.send.closedloop import run_closed_loop
from servemon.loadgen.send.timing import Outcome, RequestTiming, TokenSource

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
