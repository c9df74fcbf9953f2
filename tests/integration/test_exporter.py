"""The exporter over real sockets: simulators in every dialect behind it, its own
``/metrics`` read back and compared with what each simulator itself publishes.

Everything listens on 127.0.0.1, port 0. Nothing sleeps for readiness: tests poll
with deadlines. Every scrape of the exporter is timed against its scrape timeout.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from servemon.loadgen.send.client import ClientSettings, make_session, send_request
from servemon.monitor.config import ExporterConfig, TargetConfig
from servemon.monitor.exporter import Exporter
from servemon.monitor.fakegpu import FakeGpuReader
from servemon.simulator.config import DIALECTS

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

#: Extra time an exporter scrape may take beyond its target timeout (parse, encode,
#: a busy CI machine).
MARGIN_S = 1.0
MODEL = "sim-tiny"
ERROR_REASONS = ("connect", "timeout", "http", "too_large", "parse")


# -- helpers --------------------------------------------------------------------------


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The sum of samples ``name`` whose labels include ``labels``; None if none."""
    wanted = set(labels.items())
    found = [v for (n, have), v in samples.items() if n == name and wanted <= have]
    return sum(found) if found else None


def labels_of(samples: Samples, name: str, **labels: str) -> list[dict[str, str]]:
    wanted = set(labels.items())
    return [dict(have) for (n, have) in samples if n == name and wanted <= have]


def engine_samples(samples: Samples, target: str) -> Samples:
    return {
        (n, have): v
        for (n, have), v in samples.items()
        if n.startswith("servemon_engine_") and ("target", target) in have
    }


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@contextlib.asynccontextmanager
async def running_exporter(
    targets: Mapping[str, str], **config: Any
) -> AsyncIterator[Exporter]:
    """An exporter on a free port for ``{name: url}``; GPU off unless asked."""
    reader = config.pop("gpu_reader", None)
    config.setdefault("gpu", False)
    cfg = ExporterConfig(
        targets=tuple(
            TargetConfig(url=url, name=name) for name, url in targets.items()
        ),
        listen="127.0.0.1:0",
        **config,
    )
    async with Exporter(cfg, gpu_reader=reader, env={}) as exp:
        yield exp


async def scrape(
    http: aiohttp.ClientSession,
    exp: Exporter,
    *,
    budget: float | None = None,
    headers: Mapping[str, str] | None = None,
) -> Samples:
    """GET the exporter's /metrics; it must answer 200 within ``budget`` seconds."""
    budget = budget if budget is not None else exp.config.scrape_timeout + MARGIN_S
    start = time.monotonic()
    async with http.get(f"{exp.url}/metrics", headers=headers) as resp:
        text = await resp.text()
        assert resp.status == 200, text
    took = time.monotonic() - start
    assert took < budget, f"the exporter took {took:.2f} s (budget {budget} s)"
    return parse(text)


async def sim_metrics(http: aiohttp.ClientSession, url: str) -> Samples:
    async with http.get(f"{url}/metrics") as resp:
        assert resp.status == 200
        return parse(await resp.text())


async def chat(
    http: aiohttp.ClientSession, url: str, content: str, max_tokens: int, **extra: Any
) -> None:
    body = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": True,
        **extra,
    }
    async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()


async def abandoned_chat(
    http: aiohttp.ClientSession, url: str, content: str, max_tokens: int = 300
) -> None:
    """A stream the client leaves after its first content chunk (an abort)."""
    body = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }
    async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if b'"content":" ' in line:
                break
        resp.close()


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def words(n: int, offset: int = 0) -> str:
    return " ".join(f"w{i}" for i in range(offset, offset + n))


async def traffic(http: aiohttp.ClientSession, url: str) -> None:
    """Distinct long prompts at once (preemptions in a small KV cache), the same long
    prompt again and again (prefix hits; with end-of-sequence draws some stop early),
    and one abandoned stream (an abort)."""
    await asyncio.gather(
        *(
            chat(http, url, words(100, 1000 * i), 60, ignore_eos=True)
            for i in range(1, 7)
        )
    )
    for _ in range(3):
        await chat(http, url, words(120), 30)
    await abandoned_chat(http, url, words(20, 90_000))


IDLE_GAUGES = {
    "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
    "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
    "llamacpp": ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
}


async def wait_idle(
    http: aiohttp.ClientSession, url: str, poll_until: Any, prefix: str
) -> Samples:
    """Poll the simulator until nothing runs or waits; its metrics then."""

    running, waiting = IDLE_GAUGES[prefix]

    async def idle() -> Samples | None:
        s = await sim_metrics(http, url)
        return s if value(s, running) == 0 and value(s, waiting) == 0 else None

    result: Samples = await poll_until(idle, 10, interval=0.02, what="simulator idle")
    return result


# -- every dialect: the core series equal the simulator's own -----------------------

#: servemon series -> the family it comes from, per dialect (base names: counters
#: without ``_total``).
V1_MAP = {
    "servemon_engine_requests_running": "vllm:num_requests_running",
    "servemon_engine_requests_waiting": "vllm:num_requests_waiting",
    "servemon_engine_kv_cache_usage_ratio": "vllm:kv_cache_usage_perc",
    "servemon_engine_prefix_cache_queries": "vllm:prefix_cache_queries",
    "servemon_engine_prefix_cache_hits": "vllm:prefix_cache_hits",
    "servemon_engine_preemptions": "vllm:num_preemptions",
    "servemon_engine_prompt_tokens": "vllm:prompt_tokens",
    "servemon_engine_generation_tokens": "vllm:generation_tokens",
    "servemon_engine_requests_finished": "vllm:request_success",
    "servemon_engine_ttft_seconds": "vllm:time_to_first_token_seconds",
    "servemon_engine_itl_seconds": "vllm:inter_token_latency_seconds",
    "servemon_engine_tpot_seconds": "vllm:request_time_per_output_token_seconds",
    "servemon_engine_e2e_seconds": "vllm:e2e_request_latency_seconds",
    "servemon_engine_queue_seconds": "vllm:request_queue_time_seconds",
    "servemon_engine_prefill_seconds": "vllm:request_prefill_time_seconds",
    "servemon_engine_decode_seconds": "vllm:request_decode_time_seconds",
    "servemon_engine_request_prompt_tokens": "vllm:request_prompt_tokens",
    "servemon_engine_request_generation_tokens": "vllm:request_generation_tokens",
    "servemon_engine_iteration_tokens": "vllm:iteration_tokens_total",
}
#: What vLLM 0.25 and 0.32-0.34 added that the simulator publishes.
V025_MAP = {
    **V1_MAP,
    "servemon_engine_requests_waiting_by_reason": "vllm:num_requests_waiting_by_reason",
    "servemon_engine_prompt_tokens_by_source": "vllm:prompt_tokens_by_source",
    "servemon_engine_prompt_tokens_cached": "vllm:prompt_tokens_cached",
    "servemon_engine_request_prefill_kv_computed_tokens": (
        "vllm:request_prefill_kv_computed_tokens"
    ),
    "servemon_engine_estimated_flops_per_gpu": "vllm:estimated_flops_per_gpu",
    "servemon_engine_estimated_read_bytes_per_gpu": "vllm:estimated_read_bytes_per_gpu",
    "servemon_engine_estimated_write_bytes_per_gpu": (
        "vllm:estimated_write_bytes_per_gpu"
    ),
}
V034_MAP = {
    **V025_MAP,
    "servemon_engine_admission_rejections": "vllm:admission_rejections",
    "servemon_engine_prompt_tokens_cached_by_source": (
        "vllm:prompt_tokens_cached_by_source"
    ),
    "servemon_engine_request_preemptions": "vllm:request_num_preemptions",
}
#: The exporter names a dialect by its spellings, not its release: these are
#: vLLM's new names, its "vllm".
EXPORTER_DIALECT = {"vllm-0.25": "vllm", "vllm-0.34": "vllm"}
V08_MAP = {
    **V1_MAP,
    "servemon_engine_kv_cache_usage_ratio": "vllm:gpu_cache_usage_perc",
    "servemon_engine_prefix_cache_queries": "vllm:gpu_prefix_cache_queries",
    "servemon_engine_prefix_cache_hits": "vllm:gpu_prefix_cache_hits",
    "servemon_engine_itl_seconds": "vllm:time_per_output_token_seconds",
}
del V08_MAP["servemon_engine_tpot_seconds"]
V0_MAP = {
    **V08_MAP,
    "servemon_engine_prefix_cache_hit_ratio": "vllm:gpu_prefix_cache_hit_rate",
}
del V0_MAP["servemon_engine_prefix_cache_queries"]
del V0_MAP["servemon_engine_prefix_cache_hits"]
SGLANG_MAP = {
    "servemon_engine_requests_running": "sglang:num_running_reqs",
    "servemon_engine_requests_waiting": "sglang:num_queue_reqs",
    "servemon_engine_kv_cache_usage_ratio": "sglang:token_usage",
    "servemon_engine_prefix_cache_hits": "sglang:cached_tokens",
    "servemon_engine_prompt_tokens_cached": "sglang:cached_tokens",
    "servemon_engine_prefix_cache_hit_ratio": "sglang:cache_hit_rate",
    "servemon_engine_prompt_tokens": "sglang:prompt_tokens",
    "servemon_engine_generation_tokens": "sglang:generation_tokens",
    "servemon_engine_ttft_seconds": "sglang:time_to_first_token_seconds",
    "servemon_engine_itl_seconds": "sglang:inter_token_latency_seconds",
    "servemon_engine_e2e_seconds": "sglang:e2e_request_latency_seconds",
    "servemon_engine_queue_seconds": "sglang:queue_time_seconds",
}
MAPS = {
    "vllm": V1_MAP,
    "vllm-0.25": V025_MAP,
    "vllm-0.34": V034_MAP,
    "vllm-0.10": V1_MAP,
    "vllm-0.8": V08_MAP,
    "vllm-v0": V0_MAP,
    "sglang": SGLANG_MAP,
}
SUFFIXES = ("", "_total", "_bucket", "_count", "_sum")
SOURCE_ONLY_LABELS = {"model_name", "engine", "engine_type", "tp_rank", "pp_rank"}


def view(samples: Samples, family: str, *, target: str | None) -> Samples:
    """Samples of ``family`` by suffix and the labels that are neither servemon's
    identity labels nor the engine's own (``finished_reason`` becomes ``reason``)."""
    out: Samples = {}
    for (name, have), v in samples.items():
        suffix = name[len(family) :]
        if not name.startswith(family) or suffix not in SUFFIXES:
            continue
        labels = dict(have)
        if target is not None:
            if labels.pop("target", None) != target:
                continue
            for key in ("model", "engine", "rank"):  # checked on their own
                labels.pop(key, None)  # no rank on a series counted per model
        else:
            for key in SOURCE_ONLY_LABELS:
                labels.pop(key, None)
            if "finished_reason" in labels:
                labels["reason"] = labels.pop("finished_reason")
        out[(suffix.replace("_total", ""), frozenset(labels.items()))] = v
    return out


def engine_families(samples: Samples, target: str) -> set[str]:
    """Base names of the servemon engine series published for ``target``."""
    found = set()
    for name, _ in engine_samples(samples, target):
        for suffix in ("_total", "_bucket", "_count", "_sum"):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
                break
        found.add(name)
    return found - {"servemon_engine_info"}


@pytest.mark.asyncio
@pytest.mark.parametrize("dialect", [d for d in DIALECTS if d != "llamacpp"])
async def test_core_series_equal_the_simulators_own(
    dialect: str, start_sim: Any, http: aiohttp.ClientSession, poll_until: Any
) -> None:
    prefix = "sglang" if dialect == "sglang" else "vllm"
    async with start_sim(
        metrics_dialect=dialect, num_gpu_blocks=24, eos_probability=0.1
    ) as sim:
        await traffic(http, sim.url)
        truth = await wait_idle(http, sim.url, poll_until, prefix)
        async with running_exporter({"sim": sim.url}) as exp:
            got = await scrape(http, exp)
            mapping = MAPS[dialect]
            assert engine_families(got, "sim") == set(mapping)
            for ours, theirs in mapping.items():
                expected = view(truth, theirs, target=None)
                assert expected, f"{theirs} missing from the simulator"
                assert view(got, ours, target="sim") == expected, ours
            # Every label set is servemon's: target, model, engine, rank (+reason, le).
            for name, have in engine_samples(got, "sim"):
                if name == "servemon_engine_info":
                    continue
                labels = dict(have)
                assert labels["engine"] == prefix
                per_model = name.startswith("servemon_engine_admission_rejections")
                assert labels.get("rank") == (None if per_model else "0"), name
                assert labels["model"] == MODEL
            # The traffic made the comparison worth something.
            gen = value(got, "servemon_engine_generation_tokens_total", target="sim")
            assert gen is not None
            assert gen > 360
            assert value(got, "servemon_engine_ttft_seconds_count", target="sim") == 10
            if dialect != "sglang":
                assert value(got, "servemon_engine_preemptions_total", target="sim")
                for reason in ("stop", "length", "abort"):
                    assert value(
                        got,
                        "servemon_engine_requests_finished_total",
                        target="sim",
                        reason=reason,
                    ), reason
            if dialect != "vllm-v0":
                assert value(
                    got, "servemon_engine_prefix_cache_hits_total", target="sim"
                )
            assert value(got, "servemon_target_up", target="sim") == 1
            for reason in ERROR_REASONS:
                errors = value(
                    got,
                    "servemon_target_scrape_errors_total",
                    target="sim",
                    reason=reason,
                )
                assert errors == 0
            duration = value(
                got, "servemon_target_scrape_duration_seconds", target="sim"
            )
            assert duration is not None
            assert 0 < duration < exp.config.scrape_timeout

            # servemon_engine_info: /v1/models and /version are read in the background.
            async with http.get(f"{sim.url}/version") as resp:
                version = (await resp.json())["version"]

            async def info() -> dict[str, str] | None:
                found = labels_of(
                    await scrape(http, exp), "servemon_engine_info", target="sim"
                )
                assert len(found) <= 1
                if (
                    found
                    and found[0]["max_model_len"]
                    and found[0]["version"] == version
                ):
                    return found[0]
                return None

            labels = await poll_until(info, 10, interval=0.02, what="engine info")
    assert labels["engine"] == prefix
    assert labels["dialect"] == EXPORTER_DIALECT.get(dialect, dialect)
    assert labels["model"] == MODEL
    assert labels["max_model_len"] == "4096"
    if dialect != "sglang":
        assert labels["block_size"] == "16"
        assert labels["num_gpu_blocks"] == "24"
        assert labels["prefix_caching"] == "True"
    unit = {"vllm": "tokens", "vllm-0.10": "tokens", "vllm-0.8": "blocks"}
    if EXPORTER_DIALECT.get(dialect, dialect) in unit:
        assert (
            labels["prefix_cache_unit"] == unit[EXPORTER_DIALECT.get(dialect, dialect)]
        )


GAUGES = {
    "vllm": (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    ),
    "vllm-0.8": (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:gpu_cache_usage_perc",
    ),
    "sglang": (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
    ),
}
GAUGE_NAMES = (
    "servemon_engine_requests_running",
    "servemon_engine_requests_waiting",
    "servemon_engine_kv_cache_usage_ratio",
)


@pytest.mark.asyncio
@pytest.mark.parametrize("dialect", GAUGES)
async def test_gauges_under_load_equal_the_simulators(
    dialect: str, start_sim: Any, http: aiohttp.ClientSession
) -> None:
    """A slow engine (one step every ~50 ms) with more requests than it runs at
    once; a scrape of the exporter between two equal scrapes of the simulator must
    show the same running, waiting and KV usage. The requests are read to their
    end (300 steps, longer than the deadline), so the load stays while the exporter
    starts on a busy machine (streams left at their first token emptied the queue
    before a CI run's exporter answered)."""
    async with start_sim(metrics_dialect=dialect, speed=0.02, max_num_seqs=2) as sim:
        load = [
            asyncio.create_task(
                chat(http, sim.url, words(60, 1000 * i), 300, ignore_eos=True)
            )
            for i in range(4)
        ]
        try:
            async with running_exporter({"sim": sim.url}) as exp:
                deadline = time.monotonic() + 10
                while True:
                    assert time.monotonic() < deadline, "no stable moment under load"
                    before = await sim_metrics(http, sim.url)
                    got = await scrape(http, exp)
                    after = await sim_metrics(http, sim.url)
                    theirs = [value(before, n) for n in GAUGES[dialect]]
                    if theirs != [value(after, n) for n in GAUGES[dialect]]:
                        continue
                    if not theirs[0] or not theirs[1]:
                        await asyncio.sleep(0.01)  # not loaded yet
                        continue
                    break
                ours = [value(got, n, target="sim") for n in GAUGE_NAMES]
                assert ours == theirs
                assert ours[0] == 2  # max_num_seqs
                assert ours[1] == 2
                assert ours[2] is not None
                assert 0 < ours[2] <= 1
        finally:
            for task in load:
                task.cancel()
            await asyncio.gather(*load, return_exceptions=True)


@pytest.mark.asyncio
async def test_two_targets_have_their_own_target_label(
    start_sim: Any, http: aiohttp.ClientSession, poll_until: Any
) -> None:
    async with (
        start_sim(metrics_dialect="vllm") as a,
        start_sim(metrics_dialect="sglang", served_model_name="other") as b,
    ):
        await chat(http, a.url, words(30), 5)
        for i in range(3):
            await chat(http, b.url, words(30, 100 * i), 7)
        async with running_exporter({"a": a.url, "b": b.url}) as exp:
            got = await scrape(http, exp)
            for name, sim, gen, model, engine in (
                ("a", a, 5.0, MODEL, "vllm"),
                ("b", b, 21.0, "other", "sglang"),
            ):
                assert value(got, "servemon_target_up", target=name) == 1
                truth = await sim_metrics(http, sim.url)
                theirs = value(truth, f"{engine}:generation_tokens_total")
                ours = value(
                    got, "servemon_engine_generation_tokens_total", target=name
                )
                assert ours == theirs == gen
                for labels in labels_of(
                    got, "servemon_engine_generation_tokens_total", target=name
                ):
                    assert (labels["model"], labels["engine"]) == (model, engine)
            assert {d["target"] for d in labels_of(got, "servemon_target_up")} == {
                "a",
                "b",
            }

            async def both_infos() -> bool:
                found = labels_of(await scrape(http, exp), "servemon_engine_info")
                return sorted(d["target"] for d in found) == ["a", "b"]

            await poll_until(both_infos, 10, interval=0.02, what="two info series")


@pytest.mark.asyncio
async def test_lora_adapter_pressure_is_mapped_from_the_newest_sample(
    start_sim: Any, http: aiohttp.ClientSession, poll_until: Any
) -> None:
    """Two adapters, --max-loras 1: one runs, the other waits, and the exporter says
    so from vllm:lora_requests_info's newest sample."""
    config = {"lora_modules": ["sql", "chat"], "max_loras": 1, "speed": 0.25}
    async with start_sim(**config) as sim, running_exporter({"sim": sim.url}) as exp:
        url = f"{sim.url}/v1/chat/completions"

        def body(model: str) -> dict[str, Any]:
            return {
                "model": model,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 400,
                "ignore_eos": True,
            }

        load = [asyncio.create_task(http.post(url, json=body("sql")))]
        common = {"target": "sim", "model": MODEL, "engine": "vllm", "rank": "0"}

        async def gauges() -> tuple[float | None, ...]:
            got = await scrape(http, exp)
            return tuple(
                value(got, f"servemon_engine_lora_adapters_{kind}", **common)
                for kind in ("running", "waiting", "max")
            )

        try:
            await poll_until(
                lambda: _is(gauges(), (1.0, 0.0, 1.0)), 10, what="sql running"
            )
            load.append(asyncio.create_task(http.post(url, json=body("chat"))))
            await poll_until(
                lambda: _is(gauges(), (1.0, 1.0, 1.0)), 10, what="chat waiting"
            )
            got = await scrape(http, exp)
            active = "servemon_engine_lora_adapter_active"
            states = {
                (d["adapter"], d["state"]): value(got, active, **d)
                for d in labels_of(got, active)
            }
            assert states[("sql", "running")] == 1.0
            assert states[("chat", "waiting")] == 1.0
            assert states.get(("chat", "running"), 0.0) == 0.0
        finally:
            for task in load:
                task.cancel()
            await asyncio.gather(*load, return_exceptions=True)


async def _is(pending: Any, wanted: tuple[float, ...]) -> bool:
    return bool(await pending == wanted)


# -- serving: OpenMetrics, /healthz, auth ------------------------------------------


@pytest.mark.asyncio
async def test_openmetrics_when_asked_and_text_otherwise(
    start_sim: Any, http: aiohttp.ClientSession
) -> None:
    async with start_sim() as sim, running_exporter({"sim": sim.url}) as exp:
        await chat(http, sim.url, words(20), 3)
        accept = {"Accept": "application/openmetrics-text; version=1.0.0"}
        async with http.get(f"{exp.url}/metrics", headers=accept) as resp:
            assert resp.status == 200
            content_type = resp.headers["Content-Type"]
            om = await resp.text()
        assert content_type.startswith("application/openmetrics-text; version=1.0.0")
        assert om.endswith("# EOF\n")
        families = {f.name: f for f in openmetrics_families(om)}  # a strict parser
        assert families["servemon_engine_generation_tokens"].type == "counter"
        assert families["servemon_engine_ttft_seconds"].type == "histogram"
        assert families["servemon_target_up"].samples[0].value == 1

        async with http.get(f"{exp.url}/metrics") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = await resp.text()
        assert "# EOF" not in text
        assert value(parse(text), "servemon_engine_generation_tokens_total") == 3
        # The exporter's own process metrics are included.
        assert value(parse(text), "process_cpu_seconds_total") is not None

        async with http.get(f"{exp.url}/healthz") as resp:
            assert resp.status == 200


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["bearer", "basic"])
async def test_auth_file(
    kind: str, tmp_path: Path, start_sim: Any, http: aiohttp.ClientSession
) -> None:
    token = "tok-9f8e7d6c5b4a-SECRET"
    password = "pw-0a1b2c3d4e-SECRET"
    auth_file = tmp_path / "auth.yaml"
    if kind == "bearer":
        auth_file.write_text(f"bearer_token: {token}\n")
        right = {"Authorization": f"Bearer {token}"}
        wrong = [
            {"Authorization": "Bearer nope"},
            {"Authorization": f"Bearer {token}x"},
            {"Authorization": f"Basic {token}"},
        ]
        secret = token
    else:
        auth_file.write_text(
            f"basic_auth:\n  username: scraper\n  password: {password}\n"
        )
        right = {"Authorization": basic("scraper", password)}
        wrong = [
            {"Authorization": basic("scraper", "nope")},
            {"Authorization": basic("other", password)},
            {"Authorization": f"Bearer {password}"},
        ]
        secret = password
    async with (
        start_sim() as sim,
        running_exporter({"sim": sim.url}, auth_file=str(auth_file)) as exp,
    ):
        bodies = []
        for headers in [{}, *wrong]:
            async with http.get(f"{exp.url}/metrics", headers=headers) as resp:
                assert resp.status == 401, headers
                assert "WWW-Authenticate" in resp.headers
                bodies.append(await resp.text())
        async with http.get(f"{exp.url}/metrics", headers=right) as resp:
            assert resp.status == 200
            body = await resp.text()
            bodies.append(body)
        assert value(parse(body), "servemon_target_up", target="sim") == 1
        async with http.get(f"{exp.url}/healthz") as resp:
            assert resp.status == 200
            bodies.append(await resp.text())
        assert all(secret not in b for b in bodies)
        assert secret not in repr(exp.auth)
        assert secret not in str(exp.auth)


# -- canary probe ---------------------------------------------------------------------


@pytest.mark.asyncio
async def test_canary_probe(
    tmp_path: Path, start_sim: Any, http: aiohttp.ClientSession, poll_until: Any
) -> None:
    trace = tmp_path / "trace.jsonl"
    async with (
        start_sim(trace=str(trace)) as sim,
        running_exporter({"sim": sim.url}, probe_interval=0.05) as exp,
    ):

        async def probes(at_least: float) -> Samples | None:
            got = await scrape(http, exp)
            ok = value(got, "servemon_probe_requests_total", target="sim", outcome="ok")
            return got if ok is not None and ok >= at_least else None

        first: Samples = await poll_until(
            lambda: probes(2), 10, interval=0.02, what="two probes"
        )
        count = value(
            first, "servemon_probe_requests_total", target="sim", outcome="ok"
        )
        assert count is not None
        later: Samples = await poll_until(
            lambda: probes(count + 2), 10, interval=0.02, what="more probes"
        )
        for name in ("servemon_probe_ttft_seconds", "servemon_probe_e2e_seconds"):
            observed = value(later, f"{name}_count", target="sim")
            assert observed is not None
            assert observed >= count
            assert value(later, f"{name}_bucket", target="sim", le="+Inf") == observed
        for outcome in ("http_error", "timeout", "connect_error", "stream_error"):
            failed = value(
                later, "servemon_probe_requests_total", target="sim", outcome=outcome
            )
            assert not failed, outcome

        def probe_records() -> list[dict[str, Any]]:
            if not trace.exists():
                return []
            lines = trace.read_text().splitlines()
            return [json.loads(line) for line in lines if line.strip()]

        records = await poll_until(
            probe_records, 10, interval=0.02, what="probe requests in the trace"
        )
    ids = [r["request_id"] for r in records]
    assert all(i.startswith("servemon-probe-") for i in ids), ids
    assert len(set(ids)) == len(ids)
    assert all(r["status"] == 200 and 0 < r["output_tokens"] <= 8 for r in records)


# -- GPU -----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_no_gpu_publishes_only_gpu_up_zero(
    start_sim: Any, http: aiohttp.ClientSession
) -> None:
    reader = FakeGpuReader()
    async with (
        start_sim() as sim,
        running_exporter({"sim": sim.url}, gpu=False, gpu_reader=reader) as exp,
    ):
        got = await scrape(http, exp)
    assert value(got, "servemon_gpu_up") == 0
    assert [n for n, _ in got if n.startswith("servemon_gpu_")] == ["servemon_gpu_up"]
    assert reader.opens == 0
    assert reader.reads == 0


@pytest.mark.asyncio
async def test_fake_gpu_snapshot_is_published(
    start_sim: Any, http: aiohttp.ClientSession, poll_until: Any
) -> None:
    async with (
        start_sim() as sim,
        running_exporter(
            {"sim": sim.url}, gpu=True, gpu_interval=0.05, gpu_reader=FakeGpuReader()
        ) as exp,
    ):

        async def gpu_up() -> Samples | None:
            got = await scrape(http, exp)
            return got if value(got, "servemon_gpu_up") == 1 else None

        got: Samples = await poll_until(gpu_up, 10, interval=0.02, what="GPU up")
    total = labels_of(got, "servemon_gpu_memory_total_bytes")
    assert len(total) == 1
    assert total[0]["gpu"] == "0"
    assert total[0]["uuid"]
    assert total[0]["name"]
    memory = value(got, "servemon_gpu_memory_total_bytes")
    assert memory is not None
    assert memory > 0
    age = value(got, "servemon_gpu_sample_age_seconds")
    assert age is not None
    assert 0 <= age < 10
    # The demo GPU draws 300 W and counts its energy, a counter in joules.
    assert value(got, "servemon_gpu_power_watts") == 300
    energy = value(got, "servemon_gpu_energy_joules_total")
    assert energy is not None
    assert energy >= 0
    # The engine side is unaffected.
    assert value(got, "servemon_target_up", target="sim") == 1


@pytest.mark.asyncio
async def test_fake_gpus_energy_grows_at_their_power(
    start_sim: Any, http: aiohttp.ClientSession, poll_until: Any
) -> None:
    reader = FakeGpuReader(gpus=2, power_watts=250.0)
    async with (
        start_sim() as sim,
        running_exporter(
            {"sim": sim.url}, gpu=True, gpu_interval=0.05, gpu_reader=reader
        ) as exp,
    ):

        async def energy() -> float | None:
            got = await scrape(http, exp)
            return value(got, "servemon_gpu_energy_joules_total", gpu="1")

        first = await poll_until(energy, 10, interval=0.02, what="GPU energy")
        await asyncio.sleep(0.3)
        second = await poll_until(energy, 10, interval=0.02, what="GPU energy")
        response = await http.get(f"{exp.url}/metrics")
        text = await response.text()
    # 0.3 s or more at 250 W, read every 0.05 s: at least 250 * 0.2 J more.
    assert second - first >= 250 * 0.2
    assert "# TYPE servemon_gpu_energy_joules_total counter" in text


# -- faults ---------------------------------------------------------------------------

TEN_MB = 10 * 1024 * 1024
SMALL_EXPOSITION = (
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{model_name="big",engine="0"} 7\n'
)


def big_exposition() -> bytes:
    """A valid exposition of 10 MiB: one gauge and a lot of comment lines."""
    pad = "# " + "x" * 1021 + "\n"
    body = SMALL_EXPOSITION + pad * (TEN_MB // len(pad) + 1)
    return body.encode()[: TEN_MB - 1] + b"\n"


@contextlib.asynccontextmanager
async def big_target() -> AsyncIterator[tuple[str, Callable[[], Any]]]:
    """An aiohttp app serving a 10 MiB /metrics until ``recover()``."""
    state = {"big": True}
    body = big_exposition()

    async def metrics(request: web.Request) -> web.Response:
        if state["big"]:
            return web.Response(body=body, content_type="text/plain")
        return web.Response(text=SMALL_EXPOSITION, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]

        async def recover() -> None:
            state["big"] = False

        yield f"http://{host}:{port}", recover
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def faulty_target(
    reason: str, start_sim: Any, http: aiohttp.ClientSession
) -> AsyncIterator[tuple[str, Callable[[], Any]]]:
    """A target failing for ``reason``, and a coroutine function that heals it."""
    if reason == "too_large":
        async with big_target() as pair:
            yield pair
        return
    async with contextlib.AsyncExitStack() as stack:
        if reason == "connect":
            port = free_port()  # bound and closed: nothing listens there
            url = f"http://127.0.0.1:{port}"

            async def recover() -> None:
                await stack.enter_async_context(start_sim(port=port))

        else:
            mode = {"timeout": "hang", "http": "503", "parse": "garbage"}[reason]
            sim = await stack.enter_async_context(start_sim(faults={"metrics": mode}))
            url = sim.url

            async def recover() -> None:
                body = {"faults": {"metrics": "ok"}}
                async with http.put(f"{url}/sim/config", json=body) as resp:
                    assert resp.status == 200, await resp.text()

        yield url, recover


def assert_failed(got: Samples, target: str, reason: str, times: int) -> None:
    assert value(got, "servemon_target_up", target=target) == 0
    for r in ERROR_REASONS:
        errors = value(
            got, "servemon_target_scrape_errors_total", target=target, reason=r
        )
        assert errors == (times if r == reason else 0), r
    assert engine_samples(got, target) == {}, "nothing stale for a failed target"
    assert not labels_of(got, "servemon_engine_info", target=target)


@pytest.mark.asyncio
@pytest.mark.parametrize("reason", ERROR_REASONS)
async def test_a_failing_target_is_down_counted_and_recovers(
    reason: str, start_sim: Any, http: aiohttp.ClientSession, poll_until: Any
) -> None:
    timeout = 0.5
    async with (
        start_sim() as healthy,
        faulty_target(reason, start_sim, http) as (bad_url, recover),
        running_exporter(
            {"bad": bad_url, "ok": healthy.url}, scrape_timeout=timeout
        ) as exp,
    ):
        await chat(http, healthy.url, words(10), 2)
        for times in (1, 2):
            got = await scrape(http, exp)
            assert_failed(got, "bad", reason, times)
            # The other target is served as usual.
            assert value(got, "servemon_target_up", target="ok") == 1
            ok_gen = value(got, "servemon_engine_generation_tokens_total", target="ok")
            assert ok_gen == 2
        await recover()

        async def up() -> Samples | None:
            got = await scrape(http, exp)
            return got if value(got, "servemon_target_up", target="bad") == 1 else None

        got = await poll_until(up, 10, interval=0.02, what="recovery")
        assert value(got, "servemon_engine_requests_running", target="bad") is not None
        errors = value(
            got, "servemon_target_scrape_errors_total", target="bad", reason=reason
        )
        assert errors is not None
        assert errors >= 2


@pytest.mark.asyncio
async def test_the_scrapers_timeout_header_bounds_the_wait(
    start_sim: Any, http: aiohttp.ClientSession
) -> None:
    """A hanging target with a generous configured timeout: Prometheus's own
    timeout header keeps the answer in time."""
    async with (
        start_sim(faults={"metrics": "hang"}) as sim,
        running_exporter({"sim": sim.url}, scrape_timeout=20) as exp,
    ):
        headers = {"X-Prometheus-Scrape-Timeout-Seconds": "1"}
        got = await scrape(http, exp, budget=1.0, headers=headers)
        assert_failed(got, "sim", "timeout", 1)


@pytest.mark.asyncio
async def test_counters_follow_a_restarted_simulator_on_the_same_port(
    start_sim: Any, http: aiohttp.ClientSession, poll_until: Any
) -> None:
    async with contextlib.AsyncExitStack() as first:
        sim = await first.enter_async_context(start_sim())
        port = urlsplit(sim.url).port
        assert port is not None
        url = sim.url
        await asyncio.gather(
            *(chat(http, url, words(30, 100 * i), 20) for i in range(4))
        )
        async with running_exporter({"sim": url}, scrape_timeout=1.0) as exp:
            got = await scrape(http, exp)
            before = value(got, "servemon_engine_generation_tokens_total", target="sim")
            assert before == 80
            assert value(got, "servemon_engine_e2e_seconds_count", target="sim") == 4

            await first.aclose()  # the engine goes away ...
            got = await scrape(http, exp)
            assert_failed(got, "sim", "connect", 1)

            async with start_sim(port=port) as again:  # ... and comes back, reset
                assert again.url == url
                await chat(http, url, words(30), 5)

                async def followed() -> Samples | None:
                    got = await scrape(http, exp)
                    gen = value(got, "servemon_engine_generation_tokens_total")
                    return got if gen == 5 else None

                got = await poll_until(followed, 10, interval=0.02, what="new values")
                assert value(got, "servemon_target_up", target="sim") == 1
                assert (
                    value(got, "servemon_engine_e2e_seconds_count", target="sim") == 1
                )
                truth = await sim_metrics(http, url)
                assert value(truth, "vllm:generation_tokens_total") == 5


@pytest.mark.asyncio
async def test_passthrough_passes_unknown_families_with_a_target_label(
    start_sim: Any, http: aiohttp.ClientSession
) -> None:
    async with start_sim() as sim:
        await chat(http, sim.url, words(10), 3)
        async with running_exporter({"sim": sim.url}, passthrough=True) as exp:
            got = await scrape(http, exp)
        async with running_exporter({"sim": sim.url}) as exp:
            plain = await scrape(http, exp)
    count = value(got, "vllm:request_inference_time_seconds_count", target="sim")
    assert count is not None
    assert count > 0
    assert value(plain, "vllm:request_inference_time_seconds_count") is None
    info = labels_of(got, "vllm:cache_config_info")
    assert [d["target"] for d in info] == ["sim"]
    # Mapped families are not passed through a second time.
    assert value(got, "vllm:generation_tokens_total") is None
    assert value(got, "servemon_engine_generation_tokens_total", target="sim") == 3


@pytest.mark.asyncio
async def test_passthrough_exposition_has_each_family_once(
    start_sim: Any, http: aiohttp.ClientSession
) -> None:
    async with (
        start_sim() as sim,
        running_exporter({"sim": sim.url}, passthrough=True) as exp,
    ):
        async with http.get(f"{exp.url}/metrics") as resp:
            text = await resp.text()
        accept = {"Accept": "application/openmetrics-text; version=1.0.0"}
        async with http.get(f"{exp.url}/metrics", headers=accept) as resp:
            om = await resp.text()
    declared = [
        line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")
    ]
    duplicates = sorted({n for n in declared if declared.count(n) > 1})
    assert duplicates == []
    list(openmetrics_families(om))  # raises "Clashing name" on a duplicate family


@pytest.mark.asyncio
async def test_llamacpp_series_land_on_servemons_schema(
    start_sim: Any, http: aiohttp.ClientSession, poll_until: Any
) -> None:
    # llama-server's names, unlabelled, no /version: mapped all the same.
    async with (
        start_sim(dialect="llamacpp", eos_probability=0.1) as sim,
        make_session(ClientSettings()) as client,  # resends on closed connections
    ):
        await asyncio.gather(
            *(
                send_request(
                    client,
                    sim.url + "/v1/chat/completions",
                    {
                        "messages": [{"role": "user", "content": words(50, i)}],
                        "max_tokens": 20,
                        "stream": True,
                    },
                    request_id=f"l{i}",
                )
                for i in range(8)
            )
        )
        truth = await wait_idle(http, sim.url, poll_until, "llamacpp")
        async with running_exporter({"sim": sim.url}) as exp:
            got = await scrape(http, exp)
    assert value(got, "servemon_target_up", target="sim") == 1
    for ours, theirs in (
        ("servemon_engine_prompt_tokens_total", "llamacpp:prompt_tokens_total"),
        ("servemon_engine_generation_tokens_total", "llamacpp:tokens_predicted_total"),
        ("servemon_engine_requests_running", "llamacpp:requests_processing"),
        ("servemon_engine_requests_waiting", "llamacpp:requests_deferred"),
        (
            "servemon_engine_prefix_cache_hits_total",
            "llamacpp:prompt_tokens_cached_total",
        ),
    ):
        expected = value(truth, theirs)
        assert expected is not None, theirs
        assert value(got, ours, target="sim", engine="llamacpp") == expected, ours
    generated = value(got, "servemon_engine_generation_tokens_total", target="sim")
    assert generated is not None
    assert generated > 0


# -- expositions written by vLLM's own code, served over a socket -------------------

VLLM_DATA = Path(__file__).resolve().parents[1] / "data" / "vllm"


@contextlib.asynccontextmanager
async def file_target(body: bytes) -> AsyncIterator[str]:
    """An aiohttp app answering /metrics with ``body``, as vLLM's front end does
    (text format 0.0.4, uncompressed)."""

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(
            body=body, headers={"Content-Type": "text/plain; version=0.0.4"}
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
async def test_the_exporter_serves_vllms_newer_series_from_its_own_expositions(
    http: aiohttp.ClientSession,
) -> None:
    files = {
        "v025": "vllm-0.25.1.txt",
        "v032": "vllm-0.32.0-live.txt",
        "v034": "vllm-0.34.0-kv-offload-spec-decode.txt",
    }
    bodies = {name: (VLLM_DATA / file).read_bytes() for name, file in files.items()}
    async with contextlib.AsyncExitStack() as stack:
        urls = {
            name: await stack.enter_async_context(file_target(body))
            for name, body in bodies.items()
        }
        async with running_exporter(urls) as exp:
            got = await scrape(http, exp)
    for name in files:
        assert value(got, "servemon_target_up", target=name) == 1
        waiting = "servemon_engine_requests_waiting_by_reason"
        assert value(got, waiting, target=name, reason="capacity") is not None
        assert value(got, "servemon_engine_iteration_tokens_count", target=name)
        assert (
            value(got, "servemon_engine_sleep_state", target=name, state="awake") == 1
        )
    # Per model, no rank: 0.32's live server and 0.34's code; 0.25.1 has none.
    rejections = "servemon_engine_admission_rejections_total"
    assert value(got, rejections, target="v025") is None
    for name, refused in (("v032", 0.0), ("v034", 1.0)):
        assert value(got, rejections, target=name) == refused
        assert all("rank" not in labels for labels in labels_of(got, rejections))
    assert value(got, "servemon_engine_render_seconds_count", target="v034") == 1
    assert value(got, "servemon_engine_kv_offload_load_bytes_total", target="v034") == (
        65536
    )
    assert value(got, "servemon_engine_spec_decode_drafts_total", target="v034") == 2
