"""Model and LoRA mixes and reasoning models against the simulator over real
sockets: each request asks for its drawn model and is counted under it, the
engine's adapter pressure reaches the run's samples, and a reasoning phase shows
as TTFA after TTFT."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from servemon.core.errors import TargetError
from servemon.loadgen.record.runrecord import RunResult
from servemon.simulator.config import SimConfig
from servemon.simulator.server import SimServer
from tests.support.runs import config_for, run

pytestmark = pytest.mark.integration

MIX = "base=0.5,sql=0.3,chat=0.2"


def _lines(result: RunResult) -> list[dict[str, Any]]:
    text = (result.path / "requests.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def test_a_model_mix_sends_each_model_its_share_and_counts_it_apart(
    tmp_path: Path,
) -> None:
    live_text: list[str] = []

    async def go() -> RunResult:
        config = SimConfig(
            host="127.0.0.1",
            port=0,
            profile="tiny",
            served_model_name=("base",),
            lora_modules=("sql", "chat"),
            max_loras=1,
            lora_load_s=0.05,
        )
        async with SimServer(config) as server:
            load = config_for(
                server,
                tmp_path,
                model=MIX,
                workload="random:prompt=64,output=16",
                stages="40:4",
                sample_interval=0.25,
            )
            task = asyncio.create_task(run("ramp", load))
            # The live client series, read while the run goes.
            async with aiohttp.ClientSession() as session:
                deadline = asyncio.get_running_loop().time() + 20
                while asyncio.get_running_loop().time() < deadline:
                    await asyncio.sleep(0.5)
                    url = _live_url(tmp_path)
                    if url is None:
                        continue
                    try:
                        async with session.get(url) as resp:
                            live_text.append(await resp.text())
                    except aiohttp.ClientError:
                        break
                    if 'model="chat"' in live_text[-1]:
                        break
            return await task

    result = asyncio.run(asyncio.wait_for(go(), 60))
    assert result.status == "completed"
    lines = _lines(result)
    assert {x["outcome"] for x in lines} == {"ok"}
    models = Counter(x["model"] for x in lines)
    assert set(models) == {"base", "sql", "chat"}
    assert models["base"] / len(lines) == pytest.approx(0.5, abs=0.15)
    # Grouped in the summary, and the three add up to the whole run.
    by_model = result.record.by_model
    assert by_model is not None
    assert {k: v.requests for k, v in by_model.items()} == dict(models)
    assert result.info.target.model == "base,sql,chat"
    # The live series carry each request's model.
    assert any(
        re.search(r'servemon_client_requests_total\{[^}]*model="sql"', text)
        for text in live_text
    )
    # With one adapter slot, the engine made the other adapter's requests wait,
    # and the run's samples of it say so in servemon's names.
    waiting = 0.0
    for line in (result.path / "server_metrics.jsonl").read_text().splitlines():
        for name, _labels, value in json.loads(line).get("samples") or []:
            if name == "servemon_engine_lora_adapters_waiting":
                waiting = max(waiting, value)
            if name == "servemon_engine_lora_adapters_max":
                assert value == 1
    assert waiting >= 1


def _live_url(tmp_path: Path) -> str | None:
    for run_json in (tmp_path / "runs").glob("*/run.json"):
        try:
            url = json.loads(run_json.read_text())["client"]["live_metrics"]
        except (ValueError, KeyError):
            return None
        return str(url) or None
    return None


def test_a_model_the_target_does_not_serve_is_refused_before_any_request(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        config = SimConfig(host="127.0.0.1", port=0, profile="tiny")
        async with SimServer(config) as server:
            await run("ramp", config_for(server, tmp_path, model="x=1,y=2"))

    with pytest.raises(TargetError) as caught:
        asyncio.run(asyncio.wait_for(go(), 30))
    assert "--model x: not served by" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert not list((tmp_path / "runs").glob("*/requests.jsonl"))


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_a_reasoning_phase_puts_the_answer_after_the_first_token(
    tmp_path: Path, field: str
) -> None:
    async def go() -> RunResult:
        config = SimConfig(
            host="127.0.0.1",
            port=0,
            profile="tiny",
            reasoning_tokens=(12, 12),
            reasoning_field=field,  # type: ignore[arg-type]
            reasoning_usage=True,
        )
        async with SimServer(config) as server:
            load = config_for(
                server, tmp_path, workload="random:prompt=16,output=24", stages="5:2"
            )
            return await run("ramp", load)

    result = asyncio.run(asyncio.wait_for(go(), 60))
    assert result.status == "completed"
    overall = result.overall
    assert overall.mean_reasoning_tokens == 12
    ttft, ttfa, itl = (overall.figure(n) for n in ("ttft", "ttfa", "itl"))
    assert ttft is not None
    assert ttfa is not None
    assert itl is not None
    # Twelve reasoning tokens come before the answer's first: about 12 gaps later.
    assert ttfa.p50 > ttft.p50 + 8 * itl.p50
    for line in _lines(result):
        assert line["reasoning_tokens"] == 12
        assert line["ttfa_s"] > line["ttft_s"]
        assert line["output_tokens"] == 24  # the whole completion, reasoning too
