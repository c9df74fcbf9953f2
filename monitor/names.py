"""servemon's metric vocabulary: the one table every published name comes from.

Each :class:`Series` is one metric family as servemon publishes it: its full name
(counters with ``_total``, as they appear in the exposition), type, unit, help text
and labels. Code that publishes or queries a servemon series takes it from here; no
code builds a metric name from pieces. ``docs/metrics.md`` is generated from this
table.

So far the table holds the client side (the load generator's live metrics); the
engine, GPU and exporter series arrive with the exporter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "CLIENT_CURRENT_STAGE",
    "CLIENT_DISPATCH_LAG",
    "CLIENT_E2E",
    "CLIENT_HELD_BACK",
    "CLIENT_IN_FLIGHT",
    "CLIENT_ITL",
    "CLIENT_OUTPUT_TOKENS",
    "CLIENT_PROMPT_TOKENS",
    "CLIENT_REQUESTS",
    "CLIENT_SKIPPED",
    "CLIENT_TARGET_RATE",
    "CLIENT_TPOT",
    "CLIENT_TTFC",
    "CLIENT_TTFT",
    "SCHEMA",
    "Series",
]

Kind = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True, slots=True)
class Series:
    """One published metric family."""

    name: str
    kind: Kind
    unit: str
    doc: str
    labels: tuple[str, ...]

    @property
    def base(self) -> str:
        """The name prometheus_client takes: a counter's name without ``_total``."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name


_CLIENT = ("target", "model", "stage")

CLIENT_REQUESTS = Series(
    "servemon_client_requests_total", "counter", "requests",
    "Finished requests by outcome (ok, http_error, timeout, connect_error, "
    "stream_error, cancelled).",
    (*_CLIENT, "outcome"),
)  # fmt: skip
CLIENT_TTFT = Series(
    "servemon_client_ttft_seconds", "histogram", "seconds",
    "Time to first token: first chunk with content minus actual send.", _CLIENT,
)  # fmt: skip
CLIENT_TTFC = Series(
    "servemon_client_ttfc_seconds", "histogram", "seconds",
    "Time to first SSE chunk of any kind (a role-only chunk counts) minus actual send.",
    _CLIENT,
)  # fmt: skip
CLIENT_ITL = Series(
    "servemon_client_itl_seconds", "histogram", "seconds",
    "Inter-token latency: each gap between consecutive content chunks.", _CLIENT,
)  # fmt: skip
CLIENT_TPOT = Series(
    "servemon_client_tpot_seconds", "histogram", "seconds",
    "Time per output token per request: (E2E - TTFT) / (output tokens - 1).", _CLIENT,
)  # fmt: skip
CLIENT_E2E = Series(
    "servemon_client_e2e_seconds", "histogram", "seconds",
    "End-to-end latency: last byte minus actual send.", _CLIENT,
)  # fmt: skip
CLIENT_DISPATCH_LAG = Series(
    "servemon_client_dispatch_lag_seconds", "histogram", "seconds",
    "Actual send minus scheduled send: how far the client fell behind its schedule.",
    _CLIENT,
)  # fmt: skip
CLIENT_OUTPUT_TOKENS = Series(
    "servemon_client_output_tokens_total", "counter", "tokens",
    "Output tokens of finished requests (usage, tokenizer or chunk count).", _CLIENT,
)  # fmt: skip
CLIENT_PROMPT_TOKENS = Series(
    "servemon_client_prompt_tokens_total", "counter", "tokens",
    "Prompt tokens of finished requests, as the server's usage reports them.", _CLIENT,
)  # fmt: skip
CLIENT_TARGET_RATE = Series(
    "servemon_client_target_requests_per_second", "gauge", "requests/s",
    "The schedule's target request rate now (0 between stages and for closed loops).",
    ("target", "model"),
)  # fmt: skip
CLIENT_IN_FLIGHT = Series(
    "servemon_client_in_flight_requests", "gauge", "requests",
    "Requests sent and not yet finished.", ("target", "model"),
)  # fmt: skip
CLIENT_CURRENT_STAGE = Series(
    "servemon_client_current_stage", "gauge", "index",
    "Index of the stage (ramp) or level (sweep) being run; -1 when none.",
    ("target", "model"),
)  # fmt: skip
CLIENT_HELD_BACK = Series(
    "servemon_client_held_back_total", "counter", "requests",
    "Requests that were due while --max-inflight requests were in flight and had to "
    "wait for a slot.", _CLIENT,
)  # fmt: skip
CLIENT_SKIPPED = Series(
    "servemon_client_skipped_total", "counter", "requests",
    "Requests never sent, by reason (late: past --late-tolerance with --late skip).",
    (*_CLIENT, "reason"),
)  # fmt: skip

SCHEMA: tuple[Series, ...] = (
    CLIENT_REQUESTS,
    CLIENT_TTFT,
    CLIENT_TTFC,
    CLIENT_ITL,
    CLIENT_TPOT,
    CLIENT_E2E,
    CLIENT_DISPATCH_LAG,
    CLIENT_OUTPUT_TOKENS,
    CLIENT_PROMPT_TOKENS,
    CLIENT_TARGET_RATE,
    CLIENT_IN_FLIGHT,
    CLIENT_CURRENT_STAGE,
    CLIENT_HELD_BACK,
    CLIENT_SKIPPED,
)
