"""PromQL over servemon's schema, built from the names table.

Every query a dashboard panel runs is built here from :mod:`monitor.names`, with the
dashboards' template variables (``$target``, ``$model``, ``$gpu``) as label matchers
and ``$__rate_interval`` as the range of every ``rate()``.
"""

from __future__ import annotations

from monitor.names import Series

__all__ = ["count", "current", "hist_quantile", "matcher", "rate", "ratio_of_rates"]

TARGET = 'target=~"$target"'
MODEL = 'model=~"$model"'
GPU = 'gpu=~"$gpu"'


def matcher(series: Series, *extra: str) -> str:
    """``{...}`` with the dashboard variables that apply to ``series``."""
    parts = []
    if "target" in series.labels:
        parts.append(TARGET)
    if "model" in series.labels:
        parts.append(MODEL)
    if "gpu" in series.labels:
        parts.append(GPU)
    parts += extra
    return "{" + ",".join(parts) + "}"


def current(series: Series, *extra: str, agg: str = "sum", by: str = "") -> str:
    """A gauge, aggregated: ``sum by (target) (x{...})``."""
    grouping = f" by ({by})" if by else ""
    return f"{agg}{grouping} ({series.name}{matcher(series, *extra)})"


def rate(series: Series, *extra: str, by: str = "", suffix: str = "") -> str:
    """Per-second rate of a counter (or of a histogram's ``_count``/``_sum``)."""
    grouping = f" by ({by})" if by else ""
    name = series.name + suffix
    return f"sum{grouping} (rate({name}{matcher(series, *extra)}[$__rate_interval]))"


def count(series: Series) -> str:
    """Requests per second observed by a histogram (its ``_count``)."""
    return rate(series, suffix="_count")


def hist_quantile(series: Series, q: float, *, by: str = "") -> str:
    """The q-quantile of a histogram over the rate interval."""
    grouping = ", ".join(["le", *([by] if by else [])])
    bucket = f"{series.name}_bucket{matcher(series)}"
    return (
        f"histogram_quantile({q}, sum by ({grouping}) "
        f"(rate({bucket}[$__rate_interval])))"
    )


def ratio_of_rates(top: Series, bottom: Series, *, by: str = "") -> str:
    """``rate(top) / rate(bottom)``, e.g. a prefix-cache hit ratio."""
    return f"{rate(top, by=by)} / {rate(bottom, by=by)}"
