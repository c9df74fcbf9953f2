"""PromQL text over servemon's schema: the one place queries are spelled.

Pure functions from :class:`servemon.core.names.Series` and strings to PromQL strings,
shared by the dashboards, the recording and alerting rules and the load generator.
A sample name is always a series' own name, or a histogram's ``_bucket``, ``_count``
or ``_sum`` of it through :func:`sample_name`; nothing here builds a metric name from
other pieces. Label matchers are strings such as ``'target=~"$target"'``; the
``outcome`` matchers of failed and judged requests come from
:mod:`servemon.core.outcomes`.

The spelling is fixed: ``op (expr)`` or ``op by (a, b) (expr)``, matchers joined by
``,`` without spaces, windows in the shortest Prometheus duration (``90`` is
``1m30s``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from servemon.core.names import Series

__all__ = [
    "DURATION_REGEX",
    "Part",
    "aggregate",
    "braces",
    "duration",
    "histogram_quantile",
    "increase",
    "le_matcher",
    "number",
    "on",
    "over_time",
    "parse_duration",
    "quantile",
    "rate",
    "sample_name",
    "selector",
]

#: The samples of a classic histogram beside its name.
Part = Literal["bucket", "count", "sum"]

_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
#: A regular expression matching every spelling :func:`duration` writes.
DURATION_REGEX = "[0-9dhms]+"


def duration(seconds: int) -> str:
    """The shortest Prometheus spelling of ``seconds`` (``90`` gives ``1m30s``)."""
    parts = []
    for unit, size in _UNITS:
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


#: Seconds in each unit of a Prometheus duration, as Prometheus reads them.
_READ_UNITS = {
    "y": 365 * 86400.0,
    "w": 7 * 86400.0,
    "d": 86400.0,
    "h": 3600.0,
    "m": 60.0,
    "s": 1.0,
    "ms": 0.001,
}
_DURATION = re.compile(r"(?:([0-9]+)(ms|y|w|d|h|m|s))")


def parse_duration(text: str) -> float | None:
    """Seconds of a Prometheus duration (``1m30s``, ``500ms``, ``15s``); None when
    ``text`` is not one."""
    text = text.strip()
    if not text or not re.fullmatch(f"{_DURATION.pattern}+", text):
        return None
    return sum(int(n) * _READ_UNITS[unit] for n, unit in _DURATION.findall(text))


def number(value: float) -> str:
    """A float as PromQL and humans read it: no binary noise, no ``.0``."""
    return repr(round(value, 12)).removesuffix(".0")


def le_matcher(edge: float) -> str:
    """The ``le`` matcher of a bucket edge; ``1`` matches ``le="1"`` and ``"1.0"``.

    Prometheus 2 keeps ``le`` as exposed: Python clients write ``1.0``, Go and Rust
    clients ``1``, and the exporter passes the engine's spelling through.
    """
    if edge == int(edge):
        return f'le=~"{int(edge)}(\\\\.0)?"'
    return f'le="{edge!r}"'


def sample_name(series: Series, part: Part | None = None) -> str:
    """The name of ``series``' samples: its own, or a histogram's ``part``."""
    if part is None:
        return series.name
    if series.kind != "histogram":
        raise ValueError(f"{series.name} is a {series.kind}: it has no _{part}")
    return f"{series.name}_{part}"


def braces(*matchers: str) -> str:
    """``{m1,m2}``: label matchers as a selector (``{}`` when there are none)."""
    return "{" + ",".join(matchers) + "}"


def selector(series: Series, *matchers: str, part: Part | None = None) -> str:
    """``name{m1,m2}``; just the name when there is no matcher."""
    name = sample_name(series, part)
    return name + braces(*matchers) if matchers else name


def rate(samples: str, window: str) -> str:
    """``rate(samples[window])``; ``window`` is a duration or ``$__rate_interval``."""
    return f"rate({samples}[{window}])"


def increase(samples: str, window: str) -> str:
    """``increase(samples[window])``."""
    return f"increase({samples}[{window}])"


def aggregate(op: str, expr: str, by: Sequence[str] = ()) -> str:
    """``op (expr)``, or ``op by (a, b) (expr)``."""
    grouping = f" by ({', '.join(by)})" if by else ""
    return f"{op}{grouping} ({expr})"


def on(labels: Sequence[str]) -> str:
    """The vector-matching clause ``on (a, b)``."""
    return f"on ({', '.join(labels)})"


def histogram_quantile(q: float, buckets: str) -> str:
    """``histogram_quantile(q, buckets)`` over an expression keeping ``le``."""
    return f"histogram_quantile({q}, {buckets})"


def quantile(
    series: Series,
    q: float,
    window: str,
    *matchers: str,
    by: Sequence[str] = (),
) -> str:
    """The q-quantile of a histogram's events over ``window``, per ``by``."""
    buckets = rate(selector(series, *matchers, part="bucket"), window)
    return histogram_quantile(q, aggregate("sum", buckets, ("le", *by)))


def over_time(op: str, samples: str, window: str) -> str:
    """``<op>_over_time(samples[window])``: ``op`` is ``avg``, ``max``, ..."""
    return f"{op}_over_time({samples}[{window}])"
