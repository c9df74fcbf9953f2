"""A random workload is one a prefix cache cannot help: checked where it shows.

The simulator's prefix cache (vLLM's hash chain of full blocks) counts queried and
hit tokens; a ``random`` run of many times the prompt pool, open or closed loop,
must leave its hit ratio at about zero, or the capacity it finds is that of a server
that skips prefill.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from servemon.loadgen.record.runrecord import RunResult
from servemon.loadgen.run.config import Kind
from servemon.loadgen.run.flat import config_of
from servemon.loadgen.run.plan import make_plan
from servemon.loadgen.run.progress import Progress
from servemon.loadgen.runner import Stopper, run_load

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def run(kind: Kind, server: Any, tmp_path: Path, **fields: Any) -> RunResult:
    base = {
        "target": server.url,
        "out": str(tmp_path / "runs"),
        "metrics_port": 0,
        "timeout": 20.0,
        "grace": 1.0,
    }
    config = config_of(kind, ("test", {**base, **fields}))
    return await run_load(
        make_plan(kind, config),
        config,
        server.url,
        argv=["servemon", kind, "(test)"],
        stop=Stopper(),
        env={},
        progress=Progress(Console(file=io.StringIO()), live=False),
    )


async def hit_ratio(url: str) -> tuple[float, float]:
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
        text = await resp.text()
    values = {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    queries = values["vllm:prefix_cache_queries_total"]
    return values["vllm:prefix_cache_hits_total"] / queries, queries


async def test_a_random_ramp_of_5000_requests_hits_no_prefix_cache(
    start_sim: Any, tmp_path: Path
) -> None:
    # 20 times the default pool of 256 bodies.
    async with start_sim(num_gpu_blocks=20000, eos_probability=0.0) as server:
        result = await run(
            "ramp",
            server,
            tmp_path,
            workload="random:prompt=48,output=2",
            stages="250:20",
            arrival="constant",
            max_requests=5000,
        )
        ratio, queries = await hit_ratio(server.url)
    lines = (result.path / "requests.jsonl").read_text().splitlines()
    assert len(lines) == 5000
    assert queries >= 5000 * 48
    assert ratio < 0.01, ratio


async def test_sweep_levels_never_resend_a_prompt(
    start_sim: Any, tmp_path: Path
) -> None:
    # Each level (and its warm-up) continues where the last one stopped.
    async with start_sim(num_gpu_blocks=20000) as server:
        result = await run(
            "sweep",
            server,
            tmp_path,
            workload="random:prompt=64,output=2",
            parallel=(1, 2, 4),
            number=(16,),
            warmup=8,
        )
        ratio, _ = await hit_ratio(server.url)
    rows = [
        json.loads(line)
        for line in (result.path / "requests.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 48
    assert ratio < 0.01, ratio
