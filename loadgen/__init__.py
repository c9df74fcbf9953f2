"""The load generator: requests sent on a schedule, timed as a client waits for them.

So far: :mod:`loadgen.timing` (one request's timeline and what is derived from it),
:mod:`loadgen.sse` (server-sent events), :mod:`loadgen.client` (one timed request),
:mod:`loadgen.closedloop` (keep N requests in flight until M finished) and
:mod:`loadgen.summary` (percentiles over a set of requests).
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
