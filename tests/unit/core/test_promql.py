"""core.promql: the one spelling of servemon's queries."""

from __future__ import annotations

import re

import pytest

from servemon.core import names
from servemon.core import promql as q


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(1, "1s"), (90, "1m30s"), (300, "5m"), (86400 * 3, "3d"), (93784, "1d2h3m4s")],
)
def test_duration_is_the_shortest_spelling_and_matches_its_regex(
    seconds: int, text: str
) -> None:
    assert q.duration(seconds) == text
    assert re.fullmatch(q.DURATION_REGEX, text)


def test_number_drops_binary_noise_and_a_trailing_zero() -> None:
    assert q.number(1 - 0.999) == "0.001"
    assert q.number(6.0) == "6"
    assert q.number(14.4) == "14.4"


def test_selectors_come_from_the_series() -> None:
    assert q.selector(names.GPU_UP) == "servemon_gpu_up"
    ttft = names.CLIENT_TTFT
    assert q.selector(ttft, 'a="1"', 'b!~"x|y"', part="count") == (
        'servemon_client_ttft_seconds_count{a="1",b!~"x|y"}'
    )
    with pytest.raises(ValueError, match="counter"):
        q.sample_name(names.CLIENT_REQUESTS, "bucket")


def test_aggregations_and_quantiles() -> None:
    assert q.aggregate("max", "x") == "max (x)"
    assert q.aggregate("sum", "x", ("target", "model")) == "sum by (target, model) (x)"
    assert q.on(("target",)) == "on (target)"
    assert q.quantile(names.ENGINE_TTFT, 0.99, "5m", 'target="a"', by=("target",)) == (
        "histogram_quantile(0.99, sum by (le, target) "
        '(rate(servemon_engine_ttft_seconds_bucket{target="a"}[5m])))'
    )


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("15s", 15.0), ("1m30s", 90.0), ("500ms", 0.5), ("2h", 7200.0)],
)
def test_parse_duration_reads_what_prometheus_writes(text: str, seconds: float) -> None:
    assert q.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "15", "s", "1.5s", "1x", "-1s"])
def test_parse_duration_is_none_for_what_is_not_a_duration(text: str) -> None:
    assert q.parse_duration(text) is None


@pytest.mark.parametrize("seconds", [1, 90, 86400 * 3, 93784])
def test_parse_duration_reads_back_what_duration_writes(seconds: int) -> None:
    assert q.parse_duration(q.duration(seconds)) == seconds
