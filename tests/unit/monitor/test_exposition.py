"""The exposition parser agrees with prometheus_client's parser, its oracle.

Every check compares :class:`ExpositionParser` with
:func:`prometheus_client.parser.text_string_to_metric_families` on the same text:
family names, types, documentation and samples (name, labels, value, timestamp).
The library yields one family per run of samples; families that come back under the
same name are compared with their samples joined.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from servemon.monitor.exposition import ExpositionParser
from servemon.simulator.config import DIALECTS
from tests.support.traffic import prefix_traffic

SampleRow = tuple[str, tuple[tuple[str, str], ...], Any, Any]
Family = tuple[str, str, list[SampleRow]]


def _value(value: float) -> Any:
    """A comparable form of a sample value (NaN equals NaN; 1 equals 1.0)."""
    return "NaN" if math.isnan(value) else float(value)


def _rows(family: Metric) -> list[SampleRow]:
    return [
        (s.name, tuple(sorted(s.labels.items())), _value(s.value), s.timestamp)
        for s in family.samples
    ]


def library(text: str, keep: Callable[[str], bool] | None = None) -> dict[str, Family]:
    """What prometheus_client makes of ``text``, by family name."""
    out: dict[str, Family] = {}
    for family in text_string_to_metric_families(text):
        if keep is not None and not keep(family.name):
            continue
        if family.name in out:
            typ, doc, rows = out[family.name]
            out[family.name] = (typ, doc, rows + _rows(family))
        else:
            out[family.name] = (family.type, family.documentation, _rows(family))
    return out


def ours(families: dict[str, Metric]) -> dict[str, Family]:
    """The parser's result in the same form (keys must be the family names)."""
    for key, family in families.items():
        assert key == family.name
    return {
        name: (family.type, family.documentation, _rows(family))
        for name, family in families.items()
    }


def assert_agrees(text: str, parser: ExpositionParser | None = None) -> None:
    parser = parser or ExpositionParser()
    expected = library(text)
    assert expected, "a test exposition should not be empty"
    assert ours(parser.parse(text)) == expected


# -- every simulator dialect's real exposition -----------------------------------------


@pytest.mark.integration
@pytest.mark.asyncio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_agrees_on_every_simulator_dialect(
    dialect: str, start_sim: Any, http: aiohttp.ClientSession
) -> None:
    async with start_sim(metrics_dialect=dialect) as server:
        await prefix_traffic(http, server.url, repeats=2)
        async with http.get(f"{server.url}/metrics") as resp:
            assert resp.status == 200
            text = await resp.text()
    parser = ExpositionParser()
    assert_agrees(text, parser)
    assert_agrees(text, parser)  # again, from the line cache
    if dialect != "llamacpp":  # llama-server has no histograms
        assert any(
            "_bucket" in row[0] for _, _, rows in library(text).values() for row in rows
        )


# -- odd but valid expositions ---------------------------------------------------------

ODD = {
    "escaped_label_values": (
        "# HELP odd_info Labels with escapes.\n"
        "# TYPE odd_info gauge\n"
        'odd_info{path="C:\\\\dir\\\\file",quote="say \\"hi\\"",nl="a\\nb"} 1\n'
        'odd_info{path="plain",quote="",nl="x"} 2\n'
        'odd_info{path="brace } and , comma",quote="=",nl="\\\\n"} 3\n'
    ),
    "nan_and_inf": (
        "# TYPE odd_gauge gauge\n"
        'odd_gauge{k="nan"} NaN\n'
        'odd_gauge{k="pinf"} +Inf\n'
        'odd_gauge{k="ninf"} -Inf\n'
        'odd_gauge{k="exp"} 1.5e-3\n'
        'odd_gauge{k="int"} 42\n'
        "odd_plain NaN\n"
    ),
    "families_without_type": (
        "# HELP helped_only A family with HELP and no TYPE.\n"
        'helped_only{a="1"} 1\n'
        'helped_only{a="2"} 2\n'
        "bare_sample 7\n"
        'bare_labelled{a="x"} 3\n'
    ),
    "type_without_samples": (
        "# HELP empty_family Declared, never set.\n"
        "# TYPE empty_family gauge\n"
        "# TYPE empty_counter counter\n"
        "# TYPE empty_histogram histogram\n"
        "# TYPE after gauge\n"
        "after 1\n"
    ),
    "help_with_escapes": (
        "# HELP esc_help A backslash \\\\ and a newline \\n in HELP.\n"
        "# TYPE esc_help gauge\n"
        "esc_help 1\n"
    ),
    "created_samples": (
        "# HELP req_total Requests.\n"
        "# TYPE req_total counter\n"
        'req_total{code="200"} 5.0\n'
        "# HELP req_created Requests.\n"
        "# TYPE req_created gauge\n"
        'req_created{code="200"} 1.7e9\n'
        "# HELP lat_seconds Latency.\n"
        "# TYPE lat_seconds histogram\n"
        'lat_seconds_bucket{le="0.1"} 1.0\n'
        'lat_seconds_bucket{le="+Inf"} 2.0\n'
        "lat_seconds_count 2.0\n"
        "lat_seconds_sum 0.3\n"
        "# HELP lat_seconds_created Latency.\n"
        "# TYPE lat_seconds_created gauge\n"
        "lat_seconds_created 1.7e9\n"
    ),
    "timestamps": (
        "# TYPE ts_gauge gauge\n"
        'ts_gauge{a="1"} 1 1700000000000\n'
        "ts_gauge 2 1700000000123\n"
        'ts_other{a="x"} -3 -1000\n'
    ),
    "counter_spellings": (
        "# TYPE c_one counter\n"
        "c_one 1\n"
        "# TYPE c_two_total counter\n"
        'c_two_total{x="y"} 2\n'
        "# TYPE c_three counter\n"
        "c_three_total 3\n"
    ),
    "summary_and_untyped": (
        "# TYPE rpc_seconds summary\n"
        'rpc_seconds{quantile="0.5"} 0.1\n'
        'rpc_seconds{quantile="0.99"} 0.9\n'
        "rpc_seconds_sum 12\n"
        "rpc_seconds_count 30\n"
        "# TYPE odd untyped\n"
        "odd 1\n"
    ),
    "whitespace_and_comments": (
        "# a free comment\n"
        "\n"
        "#\n"
        "# TYPE ws_gauge gauge\n"
        '  ws_gauge{a="1",b="2"}   1  \n'
        'ws_gauge { a = "3" , b="4", } 2\n'
        "ws_gauge\t3\n"
        "ws_other{} 4\r\n"
    ),
    "tabs_and_odd_timestamps": (
        "tab_gauge\t1\n"
        "tab_gauge 2\t3\n"
        'tab_gauge{a="1"} 4 5 6\n'
        'tab_exemplar{a="1"} 7 # {trace="x"} 8\n'
        'tab_bare 9 # {trace="y"} 10\n'
    ),
    "quoted_names": (
        '# HELP "quoted_gauge" Quoted in HELP.\n'
        '# TYPE "quoted_gauge" gauge\n'
        "quoted_gauge 1\n"
        '{__name__="from_labels",a="b"} 2\n'
    ),
    "colons_and_unicode": (
        "# HELP vllm:num_requests_running Running.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="Qwen/Qwen3-0.6B",engine="0"} 3\n'
        'vllm:num_requests_running{model_name="modèle-ü ✓",engine="1"} 4\n'
    ),
}


@pytest.mark.parametrize("text", ODD.values(), ids=ODD.keys())
def test_agrees_on_odd_expositions(text: str) -> None:
    assert_agrees(text)


def test_escaped_label_values_are_unescaped() -> None:
    families = ExpositionParser().parse(ODD["escaped_label_values"])
    first = families["odd_info"].samples[0].labels
    assert first == {"path": "C:\\dir\\file", "quote": 'say "hi"', "nl": "a\nb"}
    assert families["odd_info"].samples[2].labels["path"] == "brace } and , comma"


def test_a_family_without_type_keeps_every_sample() -> None:
    """Without HELP or TYPE, each sample is its own family in the library; by name,
    every sample must still be there (e.g. one series per data-parallel rank)."""
    text = (
        'vllm:num_requests_running{model_name="m",engine="0"} 1\n'
        'vllm:num_requests_running{model_name="m",engine="1"} 2\n'
    )
    rows = ours(ExpositionParser().parse(text))["vllm:num_requests_running"][2]
    assert [row[2] for row in rows] == [1.0, 2.0]


# -- keep ------------------------------------------------------------------------------

KEEP_TEXT = (
    "# HELP vllm:num_requests_running Running.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{engine="0"} 1\n'
    "# TYPE vllm:prompt_tokens counter\n"
    'vllm:prompt_tokens_total{engine="0"} 10\n'
    "# TYPE vllm:ttft_seconds histogram\n"
    'vllm:ttft_seconds_bucket{engine="0",le="0.1"} 1\n'
    'vllm:ttft_seconds_bucket{engine="0",le="+Inf"} 2\n'
    'vllm:ttft_seconds_count{engine="0"} 2\n'
    'vllm:ttft_seconds_sum{engine="0"} 0.5\n'
    "# TYPE process_cpu_seconds counter\n"
    "process_cpu_seconds_total 1.5\n"
    "# TYPE python_info gauge\n"
    'python_info{version="3.11"} 1\n'
    "untyped_thing 3\n"
)
KEPT = {"vllm:num_requests_running", "vllm:prompt_tokens", "vllm:ttft_seconds"}


@pytest.mark.parametrize(
    "text",
    [KEEP_TEXT, KEEP_TEXT + "late 1 1000\n"],  # a timestamp: the library's path
    ids=["plain", "timestamped"],
)
def test_keep_drops_families(text: str) -> None:
    parser = ExpositionParser()
    kept = parser.parse(text, keep=lambda name: name in KEPT)
    assert set(kept) == KEPT
    assert ours(kept) == library(text, keep=lambda name: name in KEPT)
    assert ours(parser.parse(text, keep=lambda name: False)) == {}


# -- invalid text ----------------------------------------------------------------------

SIM_GARBAGE = "<html>502 Bad Gateway</html>\nvllm:num_requests_running{{{ 1\n"

INVALID = {
    "simulator_garbage": SIM_GARBAGE,
    "words": "Internal Server Error\n",
    "value_not_a_number": "foo bar\n",
    "labelled_value_not_a_number": 'foo{a="b"} bar\n',
    "unquoted_label_value": "foo{a=b} 1\n",
    "unclosed_label_set": 'foo{a="b" 1\n',
    "duplicate_label": 'foo{a="1",a="2"} 1\n',
    "type_without_kind": "# TYPE foo\nfoo 1\n",
    "hex_value": "foo 0x10\n",
    "missing_value": 'foo{a="b"}\n',
    "json": '{"detail": "Not Found"}\n',
}
#: Text an earlier parser took although prometheus_client refuses it.
INVALID_ACCEPTED = {
    "underscore_in_value": pytest.param(
        "foo 1_000\n",
    ),
    "invalid_metric_name": pytest.param(
        "foo-bar 1\n",
    ),
    "type_without_name": pytest.param(
        "# TYPE\nfoo 1\n",
    ),
}


@pytest.mark.parametrize(
    "text",
    [*INVALID.values(), *INVALID_ACCEPTED.values()],
    ids=[*INVALID, *INVALID_ACCEPTED],
)
def test_invalid_text_raises_value_error_like_the_library(text: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 (the library's own exception)
        list(text_string_to_metric_families(text))
    parser = ExpositionParser()
    with pytest.raises(ValueError):  # noqa: PT011
        parser.parse(text)
    # A failed parse leaves the parser usable.
    assert_agrees("# TYPE ok gauge\nok 1\n", parser)


@pytest.mark.timeout(1)
@pytest.mark.parametrize(
    "text",
    ['foo_total{a="b"} 1 # {trace_id="x"} 2\n', 'foo{a="b"} 1 }\n'],
    ids=["exemplar", "stray_brace"],
)
def test_a_brace_after_the_label_set_does_not_hang(text: str) -> None:
    try:
        expected: dict[str, Family] | None = library(text)
    except ValueError:
        expected = None
    parser = ExpositionParser()
    if expected is None:
        with pytest.raises(ValueError):  # noqa: PT011
            parser.parse(text)
    else:
        assert ours(parser.parse(text)) == expected


# -- the line cache -------------------------------------------------------------------


def _many_label_sets(n: int, offset: int = 0) -> str:
    lines = ["# HELP many Many label sets.", "# TYPE many gauge"]
    lines += [
        f'many{{i="{i}",pad="{"x" * 20}"}} {i}' for i in range(offset, offset + n)
    ]
    return "\n".join(lines) + "\n"


def test_label_cache_is_bounded_and_results_stay_right() -> None:
    parser = ExpositionParser(max_cached=16)
    texts = [_many_label_sets(100, offset) for offset in (0, 50, 1000)]
    for _ in range(2):
        for text in texts:
            assert_agrees(text, parser)
            # The cache never holds more line keys than asked for.
            assert len(parser._keys) <= 16


def test_results_of_one_parse_survive_the_next() -> None:
    parser = ExpositionParser(max_cached=4)
    first = parser.parse(_many_label_sets(10))
    before = ours(first)
    parser.parse(_many_label_sets(10, offset=100))  # evicts every cached set
    assert ours(first) == before
