"""The load generator: requests sent on a schedule, timed as a client waits for them.

:mod:`servemon.loadgen.runner` runs a load command through its driver —
:mod:`servemon.loadgen.drivers.ramp` (open loop: :mod:`servemon.loadgen.send.arrivals`,
:mod:`servemon.loadgen.send.dispatch`), :mod:`servemon.loadgen.drivers.sweep` (closed
loop: :mod:`servemon.loadgen.send.closedloop`) or
:mod:`servemon.loadgen.drivers.capacity` — over one :mod:`servemon.loadgen.run.context`.
Each request is timed by :mod:`servemon.loadgen.send.client` into a
:mod:`servemon.loadgen.send.timing` record, appended to
:mod:`servemon.loadgen.record.record`'s run directory, published live by
:mod:`servemon.loadgen.run.live` and summed up as it finishes by
:mod:`servemon.loadgen.record.summary`; the run's typed record is
:mod:`servemon.loadgen.record.runrecord`. Prompts come from
:mod:`servemon.loadgen.workloads.workload`.
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
