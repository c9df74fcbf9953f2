"""The dashboards' queries: :mod:`servemon.core.promql` with Grafana's variables bound.

Every selector gets the template variables that apply to its series (``$target``,
``$model``, ``$gpu``, as label matchers, by the series' labels), and every
``rate()``/``increase()`` takes ``$__rate_interval`` as its range. The PromQL itself
is spelled by :mod:`servemon.core.promql`.
"""

from __future__ import annotations

from servemon.core import names, promql
from servemon.core.names import Series
from servemon.core.promql import Part

__all__ = [
    "GPU",
    "MODEL",
    "RATE_INTERVAL",
    "TARGET",
    "count",
    "current",
    "hist_mean",
    "hist_quantile",
    "increase",
    "per_rank_rate",
    "rate",
    "ratio_of_rates",
    "select",
    "target_rate",
]

TARGET = 'target=~"$target"'
MODEL = 'model=~"$model"'
GPU = 'gpu=~"$gpu"'
RATE_INTERVAL = "$__rate_interval"

_VARIABLES = (("target", TARGET), ("model", MODEL), ("gpu", GPU))


def _bound(series: Series) -> list[str]:
    return [matcher for label, matcher in _VARIABLES if label in series.labels]


def select(series: Series, *extra: str, part: Part | None = None) -> str:
    """``series`` with the dashboard variables that apply to it, then ``extra``."""
    return promql.selector(series, *_bound(series), *extra, part=part)


def current(
    series: Series, *extra: str, agg: str = "sum", by: tuple[str, ...] = ()
) -> str:
    """A gauge, aggregated: ``sum by (target) (x{...})``."""
    return promql.aggregate(agg, select(series, *extra), by)


def rate(
    series: Series, *extra: str, by: tuple[str, ...] = (), part: Part | None = None
) -> str:
    """Per-second rate of a counter (or of a histogram's ``part``), summed."""
    samples = promql.rate(select(series, *extra, part=part), RATE_INTERVAL)
    return promql.aggregate("sum", samples, by)


def increase(
    series: Series, *extra: str, by: tuple[str, ...] = (), part: Part | None = None
) -> str:
    """Increase of a counter (or of a histogram's ``part``) over the interval."""
    samples = promql.increase(select(series, *extra, part=part), RATE_INTERVAL)
    return promql.aggregate("sum", samples, by)


def count(series: Series) -> str:
    """Events per second observed by a histogram (its ``_count``)."""
    return rate(series, part="count")


def hist_quantile(series: Series, q: float, *, by: tuple[str, ...] = ()) -> str:
    """The q-quantile of a histogram over the rate interval."""
    return promql.quantile(series, q, RATE_INTERVAL, *_bound(series), by=by)


def hist_mean(series: Series, *, by: tuple[str, ...] = ()) -> str:
    """A histogram's mean over the rate interval: ``rate(_sum) / rate(_count)``."""
    return f"{rate(series, by=by, part='sum')} / {rate(series, by=by, part='count')}"


def per_rank_rate(series: Series) -> str:
    """Per-second rate of a counter, one series per target, model and rank (what
    the engine counts per GPU, such as its FLOP estimate, before any averaging)."""
    samples = promql.rate(select(series), RATE_INTERVAL)
    return promql.aggregate("sum", samples, ("target", "model", "rank"))


def ratio_of_rates(top: Series, bottom: Series, *, by: tuple[str, ...] = ()) -> str:
    """``rate(top) / rate(bottom)``, e.g. a prefix-cache hit ratio."""
    return f"{rate(top, by=by)} / {rate(bottom, by=by)}"


def target_rate() -> str:
    """The load generator's target request rate, summed over the picked targets
    (``$model`` is not applied)."""
    return promql.aggregate("sum", promql.selector(names.CLIENT_TARGET_RATE, TARGET))
