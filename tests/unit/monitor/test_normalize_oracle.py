"""The normalizer against its oracle: prometheus_client's parser and encoder.

servemon has one parser of the text format (:mod:`servemon.monitor.exposition`), one set
of normalization rules (:mod:`servemon.monitor.normalize_rules`) and one memoizing
writer (:mod:`servemon.monitor.normalize`, :mod:`servemon.monitor.render`). The oracle
of each check is prometheus_client: its parser (:func:`text_string_to_metric_families`)
reads the same exposition, the rules are applied to the families it gives, and its
encoders write the result. Our normalized output must equal that: as prometheus_client
families, as text in every format a scraper may ask for (byte for byte; where the
bytes differ, each is read by the library's parsers, OpenMetrics with its strict one,
for a diff by family), and in what the normalizer
says besides (engine, dialect, models, info). Where the library refuses an exposition
(or the rules do, on what it gives), ours must raise ValueError, and nothing else.

A :class:`Normalizer` reused across expositions must give what a fresh one gives:
most checks run a sequence of expositions (values moving, shapes changing, random
mutations) through one normalizer, so that its remembered plans are checked too.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Histogram,
    Info,
    Summary,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    StateSetMetricFamily,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.samples import Exemplar

from servemon.monitor.config import ExporterConfig, TargetConfig
from servemon.monitor.engine import Scrape
from servemon.monitor.exporter import Exporter
from servemon.monitor.exposition import ExpositionParser
from servemon.monitor.normalize import Normalized, Normalizer
from servemon.monitor.render import Encoder, Renderer
from servemon.simulator.config import DIALECTS
from tests.support.oracle import Expected, family_rows, oracle, parsed
from tests.support.traffic import prefix_traffic

ROOT = Path(__file__).resolve().parents[3]

#: How scrapers ask: Prometheus 3 (OpenMetrics, UTF-8 names allowed), OpenMetrics
#: plainly, Prometheus 2's text format, text with UTF-8 names, and no preference.
ACCEPTS = {
    "prometheus3": "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;"
    "q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;"
    "version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,"
    "*/*;q=0.1",
    "openmetrics": "application/openmetrics-text; version=1.0.0",
    "text": "text/plain;version=0.0.4;q=1,*/*;q=0.1",
    "text_utf8": "text/plain;version=1.0.0;escaping=allow-utf-8",
    "none": "",
}
FORMATS: list[tuple[str, Encoder, str]] = [
    (name, *choose_encoder(accept)) for name, accept in ACCEPTS.items()
]


class _Families:
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> list[Metric]:
        return self._families


def merged(families: Iterable[list[Metric]]) -> list[Metric]:
    """Same-named families of several targets merged into the first, in order of
    first appearance (as the exporter publishes them)."""
    by_name: dict[str, Metric] = {}
    for group in families:
        for family in group:
            if family.name not in by_name:
                first = Metric(family.name, family.documentation, family.type)
                by_name[family.name] = first
            by_name[family.name].samples.extend(family.samples)
    return list(by_name.values())


def assert_same_text(ours: Iterable[Normalized], theirs: list[Metric]) -> None:
    """``ours`` written by :class:`Renderer` equals ``theirs`` written by
    prometheus_client, in every format."""
    renderer = Renderer()
    ours = list(ours)
    for _, encoder, content_type in FORMATS:
        want = encoder(_Families(theirs)).decode()
        for _ in range(2):  # the second time from remembered line starts
            got = renderer.render(ours, encoder, content_type)
            got += renderer.trailer(encoder, content_type)
            if got != want:
                # The library's reading of each first, for a diff by family. Equal
                # texts read the same, so this is skipped when they are: parsing
                # both was two thirds of the module's time (2026-12-06).
                assert parsed(got, content_type) == parsed(want, content_type)
            assert got == want, content_type


def check(
    text: str,
    *,
    target: str = "t",
    model: str | None = None,
    engine: str | None = None,
    passthrough: bool = False,
    normalizer: Normalizer | None = None,
    text_too: bool = True,
) -> Normalized | None:
    """Ours on ``text`` equals the oracle's; returns ours (None: both refused)."""
    normalizer = normalizer if normalizer is not None else Normalizer()
    kwargs: dict[str, Any] = {
        "target": target,
        "model": model,
        "engine": engine,
        "passthrough": passthrough,
    }
    try:
        want: Expected | None = oracle(text, **kwargs)
    except ValueError:
        want = None
    if want is None:
        with pytest.raises(ValueError):  # noqa: PT011 (the contract names it)
            normalizer.normalize(text, **kwargs)
        return None
    ours = normalizer.normalize(text, **kwargs)
    assert (ours.engine, ours.dialect, ours.models, ours.info) == (
        want.engine,
        want.dialect,
        want.models,
        want.info,
    )
    assert family_rows(ours.families) == family_rows(want.families)
    if text_too:
        assert_same_text([ours], want.families)
    return ours


# -- the expositions ---------------------------------------------------------------
# -- the expositions ---------------------------------------------------------------


def _vllm_exposition() -> ModuleType:
    """``benchmarks/_vllm_exposition.py``, the benchmark's full vLLM exposition."""
    name = "_vllm_exposition"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, ROOT / "benchmarks" / "_vllm_exposition.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def hist(name: str, labels: str, buckets: list[tuple[str, float]], total: float) -> str:
    sep = "," if labels else ""
    braces = f"{{{labels}}}" if labels else ""
    lines = [f"# HELP {name} {name}.", f"# TYPE {name} histogram"]
    lines += [f'{name}_bucket{{{labels}{sep}le="{le}"}} {v}' for le, v in buckets]
    lines += [f"{name}_count{braces} {buckets[-1][1]}", f"{name}_sum{braces} {total}"]
    return "\n".join(lines) + "\n"


BUCKETS = [("0.01", 1.0), ("0.1", 5.0), ("1.0", 9.0), ("+Inf", 10.0)]
V1 = 'engine="0",model_name="m"'


def vllm_v1(labels: str = V1, scale: float = 1.0) -> str:
    text = ""
    for name, value in (
        ("vllm:num_requests_running", 3.0),
        ("vllm:num_requests_waiting", 2.0),
        ("vllm:kv_cache_usage_perc", 0.25),
    ):
        text += f"# HELP {name} {name}.\n# TYPE {name} gauge\n"
        text += f"{name}{{{labels}}} {value * scale}\n"
    for name, value in (
        ("vllm:prefix_cache_queries", 1000.0),
        ("vllm:prefix_cache_hits", 640.0),
        ("vllm:prompt_tokens", 1200.0),
        ("vllm:generation_tokens", 800.0),
        ("vllm:num_preemptions", 4.0),
    ):
        text += f"# HELP {name}_total {name}, in tokens.\n"
        text += f"# TYPE {name}_total counter\n"
        text += f"{name}_total{{{labels}}} {value * scale}\n"
        text += f"# HELP {name}_created {name}.\n# TYPE {name}_created gauge\n"
        text += f"{name}_created{{{labels}}} 1.7e+09\n"
    text += "# HELP vllm:request_success_total Finished.\n"
    text += "# TYPE vllm:request_success_total counter\n"
    for reason, value in (("stop", 7.0), ("length", 3.0), ("abort", 1.0)):
        text += (
            f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} '
            f"{value * scale}\n"
        )
    for name in (
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:iteration_tokens_total",
    ):
        text += hist(name, labels, [(le, v * scale) for le, v in BUCKETS], 3.5 * scale)
    return text


CACHE_CONFIG = (
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="16",enable_prefix_caching="True",'
    'engine="0",num_gpu_blocks="5000"} 1.0\n'
)
PROCESS = (
    "# HELP process_cpu_seconds_total Total user and system CPU time.\n"
    "# TYPE process_cpu_seconds_total counter\n"
    "process_cpu_seconds_total 12.5\n"
    "# HELP python_info Python platform information\n"
    "# TYPE python_info gauge\n"
    'python_info{implementation="CPython",major="3",minor="12"} 1.0\n'
)
VLLM = PROCESS + vllm_v1() + CACHE_CONFIG


def sglang(values: Callable[[int, int], float] = lambda dp, tp: 10.0 * dp + tp) -> str:
    """SGLang with DP ranks 0 and 1, each with TP ranks 0 and 1 whose copies of every
    series differ (``values(dp, tp)``), so dropping ``tp_rank`` folds them."""
    copies = [
        (f'model_name="m",tp_rank="{tp}",pp_rank="0",dp_rank="{dp}"', dp, tp)
        for dp in (0, 1)
        for tp in (0, 1)
    ]
    text = ""
    for name, kind in (
        ("sglang:num_running_reqs", "gauge"),
        ("sglang:num_queue_reqs", "gauge"),
        ("sglang:token_usage", "gauge"),
        ("sglang:cache_hit_rate", "gauge"),
        ("sglang:prompt_tokens_total", "counter"),
        ("sglang:generation_tokens_total", "counter"),
        ("sglang:cached_tokens_total", "counter"),
        ("sglang:num_retracted_reqs_total", "counter"),
    ):
        text += f"# HELP {name} {name}.\n# TYPE {name} {kind}\n"
        text += "".join(f"{name}{{{lb}}} {values(dp, tp)}\n" for lb, dp, tp in copies)
    for name in (
        "sglang:time_to_first_token_seconds",
        "sglang:e2e_request_latency_seconds",
    ):
        text += f"# HELP {name} {name}.\n# TYPE {name} histogram\n"
        for lb, dp, tp in copies:
            scaled = [(le, v * (1 + tp) + dp) for le, v in BUCKETS]
            text += hist(name, lb, scaled, 2.0 + tp).split("\n", 2)[2]
    return text


TGI = (
    "# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size 3\n"
    "# TYPE tgi_queue_size gauge\ntgi_queue_size 1\n"
    "# TYPE tgi_request_success counter\ntgi_request_success 10\n"
    '# TYPE tgi_request_failure counter\ntgi_request_failure{err="validation"} 2\n'
    + hist("tgi_request_duration", "", BUCKETS, 9.5)
    + hist("tgi_request_queue_duration", "", BUCKETS, 0.75)
    + hist("tgi_request_mean_time_per_token_duration", "", BUCKETS, 16.0)
    + hist("tgi_request_input_length", "", BUCKETS, 120.0)
)
LLAMACPP = (
    "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
    "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 1500\n"
    "# TYPE llamacpp:tokens_predicted_total counter\n"
    "llamacpp:tokens_predicted_total 700\n"
    "# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.125\n"
    "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 2\n"
    "# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 1\n"
)


# -- every simulator dialect -------------------------------------------------------


@pytest.mark.integration
@pytest.mark.asyncio
@pytest.mark.parametrize("dialect", DIALECTS)
async def test_every_simulator_dialect(
    dialect: str, start_sim: Any, http: aiohttp.ClientSession
) -> None:
    async with start_sim(metrics_dialect=dialect) as server:
        texts = []
        for _ in range(2):
            await prefix_traffic(http, server.url, repeats=3)
            async with http.get(f"{server.url}/metrics") as resp:
                assert resp.status == 200
                texts.append(await resp.text())
    normalizer = Normalizer()
    for model in (None, "configured"):
        for text in texts:
            result = check(text, model=model, normalizer=normalizer)
            assert result is not None
            assert result.families, "no engine family: nothing was compared"
    compiles = normalizer.compiles
    check(texts[-1], model="configured", normalizer=normalizer)
    assert normalizer.compiles == compiles  # from the plan
    check(texts[-1], passthrough=True)


@pytest.mark.integration
@pytest.mark.asyncio
@pytest.mark.parametrize("dialect", ["vllm", "vllm-0.10", "vllm-0.8", "vllm-v0"])
async def test_every_vllm_dialect_with_lora_adapters(
    dialect: str, start_sim: Any, http: aiohttp.ClientSession
) -> None:
    config = {"metrics_dialect": dialect, "lora_modules": ["a", "b", "c"]}
    async with start_sim(**config) as server:
        texts = []
        for adapters in (["a", "b"], ["c", "a", "b"]):
            await asyncio.gather(
                *(lora_request(http, server.url, name) for name in adapters)
            )
            async with http.get(f"{server.url}/metrics") as resp:
                texts.append(await resp.text())
    assert texts[-1].count("vllm:lora_requests_info{") >= 3
    normalizer = Normalizer()
    for text in texts:
        result = check(text, normalizer=normalizer)
        assert result is not None
        assert "servemon_engine_lora_adapter_active" in {
            f.name for f in result.families
        }


async def lora_request(http: aiohttp.ClientSession, url: str, model: str) -> None:
    body = {"model": model, "prompt": "x y z", "max_tokens": 4}
    async with http.post(f"{url}/v1/completions", json=body) as resp:
        assert resp.status == 200
        await resp.read()


# -- the benchmark's full vLLM exposition ----------------------------------------------


def test_the_benchmarks_vllm_exposition_with_four_ranks() -> None:
    module = _vllm_exposition()
    exposition = module.VllmExposition(4, seed=3)
    normalizer = Normalizer()
    for _ in range(4):
        exposition.advance()
        result = check(exposition.body.decode(), target="t0", normalizer=normalizer)
        assert result is not None
        ranks = {s.labels["rank"] for f in result.families for s in f.samples}
        assert ranks == {"0", "1", "2", "3"}
    assert normalizer.compiles == 1


VLLM_DATA = ROOT / "tests" / "data" / "vllm"


@pytest.mark.parametrize(
    "name", sorted(p.name for p in VLLM_DATA.glob("vllm-*.txt")), ids=str
)
@pytest.mark.parametrize("passthrough", [False, True], ids=["kept", "passthrough"])
def test_expositions_made_by_vllm_itself(name: str, passthrough: bool) -> None:
    text = (VLLM_DATA / name).read_text(encoding="utf-8")
    result = check(text, passthrough=passthrough)
    assert result is not None
    assert len(result.families) > 30


def test_many_targets_merge_as_prometheus_client_writes_them() -> None:
    module = _vllm_exposition()
    texts = []
    for seed in range(3):
        exposition = module.VllmExposition(2, seed=seed)
        exposition.advance()
        texts.append(exposition.body.decode())
    # The middle target declares its model; the last one is an SGLang server.
    kwargs: list[dict[str, Any]] = [
        {"target": "a"},
        {"target": "b", "model": "named"},
        {"target": "c"},
    ]
    texts[2] = sglang()
    ours = [
        Normalizer().normalize(text, **kw)
        for text, kw in zip(texts, kwargs, strict=True)
    ]
    theirs = [oracle(text, **kw) for text, kw in zip(texts, kwargs, strict=True)]
    assert_same_text(ours, merged(t.families for t in theirs))


def test_a_scrapes_families_merge_without_changing_the_targets() -> None:
    results = [Normalizer().normalize(VLLM, target=t) for t in "ab"]
    results.append(Normalizer().normalize(TGI, target="c"))
    scrape = Scrape([], results)
    first = family_rows(scrape.families())
    assert family_rows(scrape.families()) == first  # again: nothing merged twice
    expected = [oracle(VLLM, target=t).families for t in "ab"]
    expected.append(oracle(TGI, target="c").families)
    assert first == family_rows(merged(expected))


# -- SGLang's per-TP-rank copies: folding --------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        lambda dp, tp: 10.0 * dp + tp,
        lambda dp, tp: 0.1 * (dp + 1) + 0.2 * tp,  # means that round
        lambda dp, tp: math.nan if tp else 1.0,
        lambda dp, tp: 1.0 if tp else math.nan,  # max() keeps the first NaN
        lambda dp, tp: -0.0,  # a mean turns -0.0 into 0.0
        lambda dp, tp: math.inf if dp else -math.inf,
        lambda dp, tp: 1e300 * (1 + tp),  # the mean overflows to +Inf
    ],
    ids=["offsets", "rounding", "nan_second", "nan_first", "minus_zero", "inf", "huge"],
)
def test_sglang_copies_fold_as_the_rules_say(
    values: Callable[[int, int], float],
) -> None:
    result = check(sglang(values))
    assert result is not None
    ranks = {s.labels["rank"] for f in result.families for s in f.samples}
    assert ranks == {"0", "1"}


def test_gauge_minus_zero_and_nan_without_folding() -> None:
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{{{V1}}} -0.0\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        f"vllm:num_requests_waiting{{{V1}}} NaN\n"
        "# TYPE vllm:prompt_tokens_total counter\n"
        f"vllm:prompt_tokens_total{{{V1}}} -0.0\n"
        "# TYPE vllm:generation_tokens_total counter\n"
        f"vllm:generation_tokens_total{{{V1}}} +Inf\n"
        "# TYPE vllm:num_preemptions_total counter\n"
        f"vllm:num_preemptions_total{{{V1}}} -0\n"  # an integer: 0, not -0.0
    )
    check(text)


# -- odd but possible expositions, and garbage -----------------------------------------

ODD: dict[str, str] = {
    "vllm_v1": VLLM,
    "tgi": TGI,
    "llamacpp": LLAMACPP,
    "no_type_lines": (
        f"vllm:num_requests_running{{{V1}}} 1\n"
        'vllm:num_requests_running{engine="1",model_name="m"} 2\n'
        f"vllm:prompt_tokens_total{{{V1}}} 5\n"
    ),
    "help_only": (
        "# HELP vllm:num_requests_running Running.\n"
        f"vllm:num_requests_running{{{V1}}} 1\n"
    ),
    "type_without_samples": (
        "# HELP vllm:kv_cache_usage_perc KV.\n# TYPE vllm:kv_cache_usage_perc gauge\n"
        "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        "# TYPE vllm:time_to_first_token_seconds histogram\n" + VLLM
    ),
    "escaped_label_values": (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="C:\\\\m \\"q\\"\\nx",engine="0"} 1\n'
        'vllm:num_requests_running{model_name="modèle ✓",engine="1"} 2\n'
    ),
    "brace_in_label_value": (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="a}b",engine="0"} 1\n'
    ),
    "nan_and_inf": (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0"} NaN\n'
        'vllm:num_requests_running{engine="1"} +Inf\n'
        'vllm:num_requests_running{engine="2"} -Inf\n'
        'vllm:num_requests_running{engine="3"} 1.5e-3\n'
        'vllm:num_requests_running{engine="4"} 12345678.9\n'
        'vllm:num_requests_running{engine="5"} 1e22\n'
        'vllm:num_requests_running{engine="6"} inf\n'
        + hist(
            "vllm:time_to_first_token_seconds",
            V1,
            [("0.1", math.nan), ("+Inf", math.inf)],
            math.nan,
        )
    ),
    "created_lines": (
        "# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{{{V1}}} 1\n"
        f"vllm:num_requests_running_created{{{V1}}} 1.7e9\n"
        "# TYPE vllm:prompt_tokens_created gauge\n"
        f"vllm:prompt_tokens_created{{{V1}}} 1.7e9\n"
        "# TYPE vllm:generation_tokens_created gauge\n"
        f"vllm:generation_tokens_created{{{V1}}} 1.7e9\n"
    ),
    "family_split_by_another": (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0"} 1\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0"} 5\n'
        'vllm:num_requests_running{engine="1"} 2\n'
        'vllm:num_requests_running{engine="2"} 3\n'
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="3"} 4\n'
    ),
    "histogram_split_by_another": (
        hist("vllm:time_to_first_token_seconds", V1, BUCKETS, 1.0)
        + "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 5\n"
        + hist("vllm:time_to_first_token_seconds", 'engine="1"', BUCKETS, 2.0)
    ),
    "counter_spellings": (
        "# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens 3\n"
        "# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total 4\n"
        "# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total 5\n"
    ),
    "deprecated_beside_new": (
        VLLM + "# HELP vllm:gpu_cache_usage_perc Old.\n"
        "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        f"vllm:gpu_cache_usage_perc{{{V1}}} 0.99\n"
        "# HELP vllm:gpu_prefix_cache_queries_total Blocks.\n"
        "# TYPE vllm:gpu_prefix_cache_queries_total counter\n"
        f"vllm:gpu_prefix_cache_queries_total{{{V1}}} 99\n"
        + hist("vllm:time_per_output_token_seconds", V1, BUCKETS, 123.0)
    ),
    "vllm_08_blocks": (
        "# HELP vllm:gpu_prefix_cache_queries_total Queries, in blocks.\n"
        "# TYPE vllm:gpu_prefix_cache_queries_total counter\n"
        'vllm:gpu_prefix_cache_queries_total{model_name="m"} 60\n'
        "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
        + hist("vllm:time_per_output_token_seconds", 'model_name="m"', BUCKETS, 1.0)
    ),
    "vllm_v0": (
        "# TYPE vllm:num_requests_swapped gauge\nvllm:num_requests_swapped 0\n"
        "# TYPE vllm:gpu_prefix_cache_hit_rate gauge\n"
        'vllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.42\n'
        "# TYPE vllm:request_success_total counter\n"
        'vllm:request_success_total{model_name="m"} 9\n'
        'vllm:request_success_total{finished_reason="",model_name="m"} 2\n'
    ),
    "wrong_types": (
        "# TYPE vllm:num_requests_running counter\n"
        "vllm:num_requests_running 1\n"
        "# TYPE vllm:time_to_first_token_seconds gauge\n"
        "vllm:time_to_first_token_seconds 2\n"
        "# TYPE vllm:prompt_tokens_total summary\nvllm:prompt_tokens_total 3\n"
        "# TYPE vllm:e2e_request_latency_seconds unknown\n"
        "vllm:e2e_request_latency_seconds_sum 3\n"
    ),
    "histogram_edges": (
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1"} 1\n'
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf"} 2\n'
        "# TYPE vllm:e2e_request_latency_seconds histogram\n"
        'vllm:e2e_request_latency_seconds_bucket{engine="0",le="-1"} 1\n'
        'vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf"} 2\n'
        'vllm:e2e_request_latency_seconds_sum{engine="0"} 2\n'
        "# TYPE vllm:request_queue_time_seconds histogram\n"
        'vllm:request_queue_time_seconds_bucket{engine="0",le="NaN"} 1\n'
        'vllm:request_queue_time_seconds_sum{engine="0"} 1\n'
        'vllm:request_queue_time_seconds_sum{engine="0"} 7\n'
        "# TYPE vllm:inter_token_latency_seconds histogram\n"
        'vllm:inter_token_latency_seconds_count{engine="0"} 2\n'
    ),
    "histogram_copies_with_other_labels": (
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        'vllm:time_to_first_token_seconds_bucket{engine="0",x="a",le="1"} 1\n'
        'vllm:time_to_first_token_seconds_bucket{engine="0",x="b",le="1"} 5\n'
        'vllm:time_to_first_token_seconds_bucket{engine="0",x="a",le="+Inf"} 2\n'
        'vllm:time_to_first_token_seconds_sum{engine="0",x="b"} 9\n'
        'vllm:time_to_first_token_seconds_bucket{engine="0",x="b",le="+Inf"} 6\n'
        'vllm:time_to_first_token_seconds_sum{engine="0",x="a"} 3\n'
    ),
    "bucket_without_le": (
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        'vllm:time_to_first_token_seconds_bucket{engine="0"} 1\n'
    ),
    "le_not_a_number": (
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="x"} 1\n'
    ),
    "engine_by_majority": (
        "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 1\n"
        "sglang:num_queue_reqs 2\n"
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n"
    ),
    "engine_tie": (
        "# TYPE tgi_queue_size gauge\ntgi_queue_size 1\n"
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n"
    ),
    "no_engine": "# TYPE foo gauge\nfoo 1\n",
    "empty": "",
    "blank_lines_and_comments": (
        "\n# a free comment\n#\n#nospace\n#HELP x\n# HELP x\n# TYPE y\n\n"
        + VLLM
        + "\n\n"
    ),
    "help_without_doc": (
        "# HELP vllm:num_requests_running\n# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{{{V1}}} 1\n"
        "# HELP vllm:num_requests_waiting\n# TYPE vllm:num_requests_waiting gauge\n"
        f"vllm:num_requests_waiting{{{V1}}} 2\n"
    ),
    "help_with_trailing_space_and_quotes": (
        '# HELP vllm:num_requests_running Running "now", 100 %. \n'
        "# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{{{V1}}} 1\n"
    ),
    "help_with_escape": (
        "# HELP vllm:num_requests_running A \\\\ and \\n.\n"
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n"
    ),
    "whitespace_in_sample_lines": (
        "# TYPE vllm:num_requests_running gauge\n"
        '  vllm:num_requests_running{engine="0"} 1\n'
        'vllm:num_requests_running { engine = "1" } 2\n'
        'vllm:num_requests_running{engine="2"}\t3\n'
        'vllm:num_requests_running{engine="3"}  4  \n'
    ),
    "crlf": VLLM.replace("\n", "\r\n"),
    "timestamps": (
        "# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{{{V1}}} 1 1700000000000\n"
    ),
    "underscore_in_value": (
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1_000\n"
    ),
    "exemplar": (
        "# TYPE vllm:prompt_tokens_total counter\n"
        'vllm:prompt_tokens_total{engine="0"} 1 # {trace_id="x"} 2\n'
    ),
    "stray_brace": VLLM + 'vllm:num_requests_running{engine="0"} 1 }\n',
    "invalid_metric_name": "vllm-bad 1\n" + VLLM,
    "type_alone": "# TYPE\n" + VLLM,
    "help_alone": "# HELP\n" + VLLM,
    "hex_value_in_a_dropped_family": "foo 0x10\n" + VLLM,
    "garbage": "<html>502 Bad Gateway</html>\n",
    "json": '{"detail": "Not Found"}\n',
    "unknown_type": "# TYPE vllm:num_requests_running weird\n",
    "unknown_type_dropped": "# TYPE foo weird\nfoo 1\n" + VLLM,
    "name_label": 'vllm:num_requests_running{__name__="x"} 1\n',
}

#: More that the library reads in its own way (it is the oracle).
ODD |= {
    "tab_separated": "vllm:num_requests_running\t3\nvllm:num_requests_waiting 2\t1\n",
    "exemplar_without_labels": 'vllm:num_requests_running 1 # {a="b"} 2\n',
    "quoted_name_in_header": '# HELP "vllm:num_requests_running" Running.\n'
    '# TYPE "vllm:num_requests_running" gauge\nvllm:num_requests_running 1\n',
    "name_in_labels": '{__name__="vllm:num_requests_running",engine="1"} 4\n',
    "help_escapes_and_quotes": '# HELP vllm:num_requests_waiting a "b c" \\\\ d\n'
    "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 1\n",
    "summary_and_process": PROCESS + "# TYPE rpc_seconds summary\n"
    'rpc_seconds{quantile="0.5"} 0.1\nrpc_seconds_sum 12\nrpc_seconds_count 30\n'
    + VLLM,
    "big_integers": "# TYPE vllm:prompt_tokens_total counter\n"
    'vllm:prompt_tokens_total{engine="0"} 123456789012345678901234567890\n'
    'vllm:prompt_tokens_total{engine="0"} 123456789012345678901234567891\n',
    "only_cr": VLLM.replace("\n", "\r"),
    "a_bare_word": "inf\n",
    "value_then_spaces": 'vllm:num_requests_running{engine="0"} 1   \n',
}


@pytest.mark.parametrize("text", ODD.values(), ids=ODD.keys())
@pytest.mark.parametrize("model", [None, "configured"])
@pytest.mark.parametrize("passthrough", [False, True], ids=["kept", "passthrough"])
def test_odd_expositions(text: str, model: str | None, passthrough: bool) -> None:
    normalizer = Normalizer()
    for _ in range(2):  # the second from the plan
        check(text, model=model, passthrough=passthrough, normalizer=normalizer)
    check(VLLM, normalizer=normalizer)  # and it still reads a plain one


@pytest.mark.parametrize("engine", [None, "vllm", "sglang", "tgi", "llamacpp", ""])
def test_configured_engine(engine: str | None) -> None:
    for text in (VLLM, sglang(), TGI, LLAMACPP):
        check(text, engine=engine)


def test_garbage_only_ever_raises_value_error() -> None:
    """Random text from the format's own characters: whatever the library makes of
    it, ours makes the same, or both refuse (ValueError, nothing else)."""
    rng = random.Random("garbage")
    alphabet = 'ab_:{}=",# \t\n\\01.-+eINfa'
    normalizer = Normalizer()
    refused = 0
    for _ in range(600):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        if check(text, normalizer=normalizer, text_too=False) is None:
            refused += 1
    assert 0 < refused < 600


# -- plans: made once per shape, remade when the shape or the context changes ---------


def test_a_plan_is_reused_while_only_values_change() -> None:
    normalizer = Normalizer()
    for scale in (1.0, 2.0, 3.5, math.nan):
        check(vllm_v1(scale=scale), normalizer=normalizer)
    assert normalizer.compiles == 1


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.replace('engine="0"', 'engine="1"'),  # labels
        lambda t: t.replace("vllm:num_requests_waiting", "vllm:num_requests_waited"),
        lambda t: t.replace("# TYPE vllm:num_requests_running gauge\n", ""),
        lambda t: t.replace("Finished.", "Finished requests."),  # HELP text
        lambda t: t + "\n",
        lambda t: t.replace("3.0\n", "3.0 1700000000000\n", 1),  # a timestamp
        lambda t: t.replace("3.0\n", "3.0x\n", 1),  # a value that is no number
        lambda t: t.replace("3.0\n", "3.0 }\n", 1),  # a brace after the labels
        lambda t: t.replace("3.0\n", "3.0\t\n", 1),  # whitespace after the value
        lambda t: t.replace("3.0\n", "1_000\n", 1),  # float() takes it; not we
        lambda t: "\n".join(reversed(t.split("\n"))),
        lambda t: t.replace("# TYPE vllm:num_requests_running gauge\n", "#\n"),
        lambda t: t.replace("# TYPE vllm:num_requests_running gauge\n", "\n"),
    ],
)
def test_a_changed_shape_is_noticed(change: Callable[[str], str]) -> None:
    normalizer = Normalizer()
    before = "#\n" + VLLM + "\n"
    after = change(before)
    assert after != before
    for text in (before, after, before, after):
        check(text, normalizer=normalizer)


def test_a_new_model_or_target_makes_a_new_plan() -> None:
    normalizer = Normalizer()
    text = vllm_v1(labels='engine="0"')
    for model, target in ((None, "t"), ("m1", "t"), ("m1", "u"), (None, "t")):
        result = check(text, model=model, target=target, normalizer=normalizer)
        assert result is not None
        assert result.models == {model or "unknown"}
    assert normalizer.compiles == 4


def test_a_timestamped_exposition_is_read_whole_every_time() -> None:
    normalizer = Normalizer()
    for stamp in range(3):
        text = VLLM.replace("3.0\n", f"3.0 170000000000{stamp}\n", 1)
        check(text, normalizer=normalizer)
    assert normalizer.compiles == 3


def test_caches_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("servemon.monitor.normalize._TEXTS_LIMIT", 30)
    monkeypatch.setattr("servemon.monitor.render._CACHE_LIMIT", 50)
    normalizer = Normalizer()
    parser = normalizer._parser = ExpositionParser(max_cached=50)
    for scale in range(1, 30):
        text = vllm_v1(labels=f'engine="{scale}",model_name="m"', scale=scale)
        check(text, normalizer=normalizer)
        values = {line.rpartition(" ")[2] for line in text.split("\n")}
        assert len(parser._keys) <= 50
        assert len(parser._comments) <= 50
        assert len(normalizer._texts) <= 30 + len(values)
        assert len(normalizer._retired) <= 30 + len(values)
        for known in normalizer._known.values():
            assert len(known) <= 50


def test_results_of_one_scrape_survive_the_next() -> None:
    normalizer = Normalizer()
    first = normalizer.normalize(vllm_v1(scale=1.0), target="t")
    rows = family_rows(first.families)
    normalizer.normalize(vllm_v1(labels='engine="7"', scale=2.0), target="t")
    assert family_rows(first.families) == rows


# -- the rest of an answer: families written from remembered line starts ---------------


def _other_families() -> list[Metric]:
    """Families like the exporter's own and odd ones prometheus_client writes in
    ways that depend on more than each sample's name and labels."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    counter = Counter(
        "probe_requests", "Requests.", ["target", "outcome"], registry=registry
    )
    counter.labels("a", "ok").inc(3)
    counter.labels('q"uo\\te\nd', "modèle ✓").inc()
    histogram = Histogram("probe_ttft_seconds", "TTFT.", ["target"], registry=registry)
    for value in (0.01, 0.2, 3.0):
        histogram.labels("a").observe(value)
    Gauge("temp_celsius", "T.", unit="celsius", registry=registry).set(40)
    Summary("rpc_seconds", "RPC.", registry=registry).observe(0.5)
    Info("build", "Build.", registry=registry).info({"version": "1"})
    Enum("state", "State.", states=["a", "b"], registry=registry).state("b")
    families = list(registry.collect())
    up = GaugeMetricFamily("servemon_target_up", "Up.", labels=["target"])
    for target, value in (("a", 1.0), ("b", 0.0), ("c", math.nan), ("d", -0.0)):
        up.add_metric([target], value)
    errors = CounterMetricFamily("errs", "Errors.", labels=["target", "reason"])
    errors.add_metric(["a", "timeout"], 3)  # an int
    errors.add_metric(["a", "http"], math.inf, created=1.7e9)
    stamped = GaugeMetricFamily("stamped", "With a timestamp.", labels=["x"])
    stamped.add_metric(["y"], 1.0, timestamp=1.7e9)
    exemplars = HistogramMetricFamily("ex_seconds", "Exemplars.", labels=["x"])
    exemplars.add_metric(
        ["y"], [("1.0", 1.0, Exemplar({"trace": "t"}, 0.5)), ("+Inf", 2.0)], 3.0
    )
    gauge_histogram = GaugeHistogramMetricFamily("gh", "GH.", labels=["x"])
    gauge_histogram.add_metric(["y"], [("1.0", 1.0), ("+Inf", 2.0)], 3.0)
    info = InfoMetricFamily("meta", "Meta.", labels=["x"])
    info.add_metric(["y"], {"k": "v"})
    states = StateSetMetricFamily("ss", "States.", labels=["x"])
    states.add_metric(["y"], {"on": True, "off": False})
    return [
        *families,
        up,
        errors,
        stamped,
        exemplars,
        gauge_histogram,
        info,
        states,
        GaugeMetricFamily("empty", "No samples."),
    ]


@pytest.mark.parametrize(("name", "encoder", "content_type"), FORMATS)
def test_other_families_are_written_as_prometheus_client_writes_them(
    name: str, encoder: Encoder, content_type: str
) -> None:
    renderer = Renderer()
    families = _other_families()
    want = encoder(_Families(families)).decode()
    for _ in range(2):  # the second time from remembered line starts
        got = renderer.encode(encoder, content_type, families)
        assert got + renderer.trailer(encoder, content_type) == want
    for family in families:  # one by one, too
        got = renderer.encode(encoder, content_type, [family])
        assert (
            got + renderer.trailer(encoder, content_type)
            == encoder(_Families([family])).decode()
        )


def test_many_formats_are_written_right_and_not_all_remembered() -> None:
    """Scrapers may ask for any OpenMetrics version >= 1.0.0; each is its own
    format, and only a few formats are kept."""
    normalizer = Normalizer()
    renderer = Renderer()
    families = _other_families()
    theirs = oracle(VLLM).families
    for minor in range(20):
        encoder, content_type = choose_encoder(
            f"application/openmetrics-text;version=1.{minor}.0"
        )
        result = normalizer.normalize(VLLM, target="t")
        got = renderer.render([result], encoder, content_type)
        got += renderer.encode(encoder, content_type, families)
        got += renderer.trailer(encoder, content_type)
        assert got == encoder(_Families(theirs + families)).decode()
        assert len(result._plan.templates) <= 8
        assert len(normalizer._known) <= 8
        assert len(renderer._trailers) <= 8


# -- random expositions: mutations of real ones ---------------------------------------

SPECIALS = ("NaN", "+Inf", "-Inf", "-0.0", "0", "1e-9", "123456789.0", "x", "1_0")


def _mutants(base: str, rng: random.Random, count: int) -> Iterator[str]:
    lines = base.split("\n")
    for _ in range(count):
        out = list(lines)
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(out))
            kind = rng.randrange(9)
            if kind == 0:
                del out[i]
            elif kind == 1:
                out.insert(i, out[rng.randrange(len(out))])
            elif kind == 2 and i + 1 < len(out):
                out[i], out[i + 1] = out[i + 1], out[i]
            elif kind == 3 and out[i] and out[i][0] != "#":
                out[i] = out[i].rpartition(" ")[0] + " " + rng.choice(SPECIALS)
            elif kind == 4:
                out.insert(i, rng.choice(("", "#", "# comment", "# HELP x y")))
            elif kind == 5:
                out[i] = out[i].replace('"0"', '"1"')
            elif kind == 6:
                out[i] = out[i].replace("model_name", "other")
            elif kind == 7:
                out[i] = (
                    out[i].replace(" gauge", " counter").replace(" histogram", " gauge")
                )
            else:
                out[i] = out[i].replace("_total", "")
        yield "\n".join(out)


@pytest.mark.parametrize("base", ["vllm", "sglang", "tgi"])
@pytest.mark.parametrize("passthrough", [False, True], ids=["kept", "passthrough"])
def test_random_mutations(base: str, passthrough: bool) -> None:
    text = {"vllm": VLLM, "sglang": sglang(), "tgi": TGI + LLAMACPP}[base]
    rng = random.Random(f"mutations-{base}")
    # One normalizer for all: plans come and go.
    normalizer = Normalizer()
    read = 0
    for mutant in _mutants(text, rng, 60):
        for candidate in (mutant, text):
            result = check(
                candidate,
                normalizer=normalizer,
                passthrough=passthrough,
                text_too=candidate is mutant,
            )
            read += result is not None
    assert read > 80  # most mutants are read, not refused


# -- the exporter: a whole scrape against the oracle -----------------------------------


async def _static_target(text: str, delay_s: float = 0.0) -> web.AppRunner:
    async def metrics(request: web.Request) -> web.Response:
        await asyncio.sleep(delay_s)
        return web.Response(text=text)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


def _url(runner: web.AppRunner) -> str:
    host, port = runner.addresses[0][:2]
    return f"http://{host}:{port}"


def _engine_part(text: str, content_type: str) -> Any:
    families = parsed(text, content_type)
    assert not isinstance(families, tuple), families
    return [
        f
        for f in families
        if f[0].startswith("servemon_engine_") and f[0] != "servemon_engine_info"
    ]


def _sample(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    raise AssertionError(f"{name}{labels} missing")


@pytest.mark.integration
@pytest.mark.asyncio
async def test_the_exporters_answer_equals_the_oracles(
    http: aiohttp.ClientSession,
) -> None:
    module = _vllm_exposition()
    exposition = module.VllmExposition(2, seed=1)
    exposition.advance()
    bodies = {
        "bench": exposition.body.decode(),
        "sg": sglang(),
        "odd": 'unknown_family{a="}"} 1 1700000000000\n' + VLLM,
        "garbage": "<html>502 Bad Gateway</html>\n",
    }
    runners = [await _static_target(body) for body in bodies.values()]
    try:
        config = ExporterConfig(
            targets=tuple(
                TargetConfig(url=_url(r), name=name)
                for name, r in zip(bodies, runners, strict=True)
            ),
            listen="127.0.0.1:0",
            gpu=False,
        )
        expected = merged(
            oracle(body, target=name).families
            for name, body in bodies.items()
            if name != "garbage"
        )
        async with Exporter(config, env={}) as exp:
            for accept in ACCEPTS.values():
                for _ in range(2):  # the second from the plans
                    async with http.get(
                        f"{exp.url}/metrics", headers={"Accept": accept}
                    ) as resp:
                        assert resp.status == 200
                        content_type = resp.headers["Content-Type"]
                        text = await resp.text()
                    encoder, expected_type = choose_encoder(accept)
                    assert content_type == expected_type
                    want = encoder(_Families(expected)).decode()
                    assert _engine_part(text, content_type) == _engine_part(
                        want, content_type
                    )
                    assert text.count("# EOF") == (
                        1 if "openmetrics" in content_type else 0
                    )
            async with http.get(f"{exp.url}/metrics") as resp:
                text = await resp.text()
            assert exp.engine is not None
            states = exp.engine._state
            assert states["bench"].normalizer.compiles == 1
    finally:
        for runner in runners:
            await runner.cleanup()
    for name in bodies:
        up = _sample(text, "servemon_target_up", target=name)
        assert up == (0.0 if name == "garbage" else 1.0), name
    errors = _sample(
        text, "servemon_target_scrape_errors_total", target="garbage", reason="parse"
    )
    assert errors == 2 * len(ACCEPTS) + 1


@pytest.mark.integration
@pytest.mark.asyncio
async def test_scrape_duration_is_the_targets_own(
    http: aiohttp.ClientSession,
) -> None:
    """A target that answers at once with an exposition that takes long to process
    (30,000 lines never seen before) beside one that answers 50 ms later with a
    small one: the second's duration does not include the first's processing."""
    lines = "".join(
        f'vllm:num_requests_running{{engine="{i}",model_name="m"}} {i}\n'
        for i in range(30_000)
    )
    slow = "# TYPE vllm:num_requests_running gauge\n" + lines
    runners = [
        await _static_target(slow),
        await _static_target(VLLM, delay_s=0.05),
    ]
    try:
        config = ExporterConfig(
            targets=(
                TargetConfig(url=_url(runners[0]), name="slow"),
                TargetConfig(url=_url(runners[1]), name="small"),
            ),
            listen="127.0.0.1:0",
            gpu=False,
        )
        async with Exporter(config, env={}) as exp:
            start = time.monotonic()
            async with http.get(f"{exp.url}/metrics") as resp:
                text = await resp.text()
            took = time.monotonic() - start
    finally:
        for runner in runners:
            await runner.cleanup()
    durations = {
        s.labels["target"]: s.value
        for f in text_string_to_metric_families(text)
        if f.name == "servemon_target_scrape_duration_seconds"
        for s in f.samples
    }
    assert durations["slow"] > 0.1  # 30,000 lines parsed for the first time
    assert 0.05 <= durations["small"] < durations["slow"] / 2
    assert took >= durations["slow"]
