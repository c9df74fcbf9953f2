"""The load generator: requests sent on a schedule, timed as a client waits for them.

:mod:`loadgen.runner` runs a ramp (:mod:`loadgen.arrivals`, :mod:`loadgen.dispatch`)
or a sweep (:mod:`loadgen.closedloop`); each request is timed by
:mod:`loadgen.client` into a :mod:`loadgen.timing` record, recorded by
:mod:`loadgen.record`, published live by :mod:`loadgen.live` and summarized by
:mod:`loadgen.summary`. Prompts come from :mod:`loadgen.workload`.
"""

from loadgen.client import ClientSettings, send_request
from loadgen.closedloop import run_closed_loop
from loadgen.summary import Summary, summarize
from loadgen.timing import Outcome, RequestTiming, TokenSource

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
