"""The ramp-test dashboard: offered against achieved load, stage by stage.

Stage boundaries are annotations on every panel
(:func:`servemon.dashboards.panels.dashboard` adds them); latency is drawn against the
queue and the KV cache on right axes, and dispatch lag says when the client, not the
server, limited the offered load. A ``servemon control`` run shows its signal, setpoint
and offered rate.
"""

from __future__ import annotations

from grafanalib import core as g

from servemon.core import names as n
from servemon.dashboards.panels import (
    Layout,
    dashboard,
    percentiles,
    right_axis,
    timeseries,
)
from servemon.dashboards.queries import count, current, rate, target_rate

__all__ = ["ramp"]


def ramp() -> g.Dashboard:
    """Reading a ramp: stages, offered vs achieved, lag, latency against pressure."""
    lay = Layout()
    lay.add(
        timeseries(
            "Target vs achieved request rate",
            "reqps",
            (target_rate(), "target"),
            (rate(n.CLIENT_REQUESTS), "achieved (finished)"),
            (count(n.CLIENT_DISPATCH_LAG), "sent"),
        ),
        width=12,
    )
    lay.add(
        timeseries(
            "Dispatch lag (client behind its schedule)",
            "s",
            *percentiles(n.CLIENT_DISPATCH_LAG, "lag"),
            (rate(n.CLIENT_HELD_BACK), "held back by --max-inflight /s"),
            description="Actual send minus scheduled send. Lag means the client, "
            "not the server, limited the offered load.",
        ),
        width=12,
    )
    lay.add(
        timeseries(
            "Is the client the limit?",
            "percentunit",
            (
                current(n.CLIENT_CPU, agg="max"),
                "client CPU (busiest worker, of a core)",
            ),
            (rate(n.CLIENT_LIMITED, by=("reason",)), "time limited: {{reason}}"),
            (current(n.CLIENT_LOOP_DELAY, agg="max"), "event loop delay"),
            overrides=[right_axis("event loop delay", "s")],
            description="The load generator's own health (servemon's client watch): "
            "its CPU, how late its event loop wakes, and the share of time it was "
            "flagged as the limit (lag: behind its schedule; loop: event loop "
            "late; cpu: core full). While any is up, the figures measure the "
            "client as much as the target.",
        ),
        width=12,
    )
    lay.add(
        timeseries(
            "Load controller: signal against its setpoint",
            "short",
            (current(n.CLIENT_CONTROL_MEASURED, by=("signal",)), "{{signal}}"),
            (
                current(n.CLIENT_CONTROL_SETPOINT, by=("signal",)),
                "setpoint ({{signal}})",
            ),
            (current(n.CLIENT_CONTROL_OFFERED_RATE), "offered req/s"),
            (current(n.CLIENT_CONTROL_ACHIEVED_RATE), "sent req/s"),
            overrides=[
                right_axis("offered req/s", "reqps"),
                right_axis("sent req/s", "reqps"),
            ],
            description="servemon control: the held signal as the controller read "
            "it (a gap: blind), its setpoint, and the open-loop rate it offered "
            "and sent. Empty for ramps, sweeps and capacity searches.",
        ),
        width=12,
    )
    lay.add(
        timeseries(
            "TTFT against waiting requests",
            "s",
            *percentiles(n.CLIENT_TTFT, "TTFT"),
            (current(n.ENGINE_REQUESTS_WAITING), "waiting"),
            overrides=[right_axis("waiting", "short")],
        ),
        width=12,
    )
    lay.add(
        timeseries(
            "ITL against KV cache usage",
            "s",
            *percentiles(n.CLIENT_ITL, "ITL"),
            (current(n.ENGINE_KV_CACHE_USAGE, agg="max"), "KV usage"),
            overrides=[right_axis("KV usage", "percentunit")],
        ),
        width=12,
    )
    lay.add(
        timeseries(
            "Requests in flight, running, waiting",
            "short",
            (current(n.CLIENT_IN_FLIGHT), "client in flight"),
            (current(n.ENGINE_REQUESTS_RUNNING), "running"),
            (current(n.ENGINE_REQUESTS_WAITING), "waiting"),
        ),
        width=12,
    )
    lay.add(
        timeseries(
            "Outcomes and preemptions",
            "reqps",
            (rate(n.CLIENT_REQUESTS, by=("outcome",)), "{{outcome}}"),
            (rate(n.ENGINE_PREEMPTIONS), "preemptions"),
        ),
        width=12,
    )
    lay.add(
        timeseries("End-to-end latency", "s", *percentiles(n.CLIENT_E2E, "E2E")),
        width=12,
    )
    lay.add(
        timeseries(
            "Output tokens per second",
            "short",
            (rate(n.CLIENT_OUTPUT_TOKENS), "client"),
            (rate(n.ENGINE_GENERATION_TOKENS), "server"),
        ),
        width=12,
    )
    return dashboard("servemon: ramp test", "servemon-ramp", lay)
