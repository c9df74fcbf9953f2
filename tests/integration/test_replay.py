"""``servemon replay`` against the simulator over real sockets: the trace's times,
and the prefix sharing its ``hash_ids`` say, reach the server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from servemon.loadgen.workloads.replayplan import replay_plan
from servemon.loadgen.workloads.tracefile import (
    prefix_hit_ratio,
    read_trace,
    read_trace_file,
)
from servemon.loadgen.workloads.tracesynth import SynthSpec, synthesize
from servemon.simulator.config import SimConfig
from servemon.simulator.server import SimServer
from tests.support.publictraces import AZURE_2023, AZURE_2024, BURSTGPT
from tests.support.runs import config_for, run

pytestmark = pytest.mark.integration

#: 40 s of conversations (system prompts, up to 3 turns), sent 4x as fast: about
#: 10 s and 150 requests, whose distinct blocks fit the tiny simulator's cache, so
#: nothing is evicted and the server's hit ratio is the trace's own.
SPEC = SynthSpec(
    duration_s=40,
    rate=1.2,
    seed=5,
    input_median=96,
    output_median=8,
    sigma=0.5,
    system_prompts=3,
    system_tokens=1024,
    turns=3,
    think_s=4,
)
RATE_SCALE = 4.0


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _last_engine_sample(path: Path) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in read_jsonl(path):
        if line.get("samples"):
            found = {}
            for name, _labels, value in line["samples"]:
                found[name] = found.get(name, 0.0) + value
    return found


def test_a_replay_sends_the_traces_times_and_its_prefix_sharing(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(x) + "\n" for x in synthesize(SPEC)))
    entries = read_trace(trace)
    plan = replay_plan(entries, rate_scale=RATE_SCALE)

    async def go() -> Any:
        config = SimConfig(host="127.0.0.1", port=0, profile="tiny")
        async with SimServer(config) as server:
            result = await run(
                "replay",
                config_for(
                    server,
                    tmp_path,
                    "replay",
                    workload=f"trace:{trace}",
                    rate_scale=RATE_SCALE,
                    timeout=30.0,
                ),
            )
            await asyncio.sleep(1.2)  # one more sample of the server's counters
            return result

    result = asyncio.run(asyncio.wait_for(go(), plan.duration_s + 60))
    assert result.status == "completed"
    records = read_jsonl(result.path / "requests.jsonl")
    assert len(records) == len(entries)
    assert {r["outcome"] for r in records} == {"ok"}

    # Sent at the trace's times, scaled: the schedule is the trace's to the µs.
    scheduled = sorted(r["scheduled_s"] for r in records)
    got = [t - scheduled[0] for t in scheduled]
    assert got == pytest.approx([offset for _, offset in plan.sends], abs=1e-6)

    # Each request had the trace's length (the simulator counts the words).
    by_index = {int(r["id"].rsplit("-", 1)[1]): r for r in records}
    for index, entry in enumerate(entries):
        assert by_index[index]["prompt_tokens"] >= entry.prompt_tokens

    # The server's prefix cache saw the sharing the trace's hash_ids say.
    expected = prefix_hit_ratio(entries)
    assert expected is not None
    assert expected > 0.3
    engine = _last_engine_sample(result.path / "server_metrics.jsonl")
    served = (
        engine["servemon_engine_prefix_cache_hits_total"]
        / engine["servemon_engine_prefix_cache_queries_total"]
    )
    assert served == pytest.approx(expected, abs=0.03)
    summary = json.loads((result.path / "summary.json").read_text())
    assert summary["stages"][0]["label"] == "trace"


def test_shards_of_a_replay_send_the_whole_trace_between_them(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    rows = [f"{i * 0.02:.2f},8,2" for i in range(40)]
    trace.write_text("timestamp,prompt_tokens,output_tokens\n" + "\n".join(rows))

    async def go(shard: str) -> Any:
        config = SimConfig(host="127.0.0.1", port=0, profile="tiny")
        async with SimServer(config) as server:
            return await run(
                "replay",
                config_for(
                    server,
                    tmp_path / shard.replace("/", "-"),
                    "replay",
                    workload=f"trace:{trace}",
                    shard=shard,
                ),
            )

    sent: list[set[int]] = []
    for shard in ("0/2", "1/2"):
        result = asyncio.run(asyncio.wait_for(go(shard), 60))
        assert result.status == "completed"
        records = read_jsonl(result.path / "requests.jsonl")
        sent.append({int(r["id"].rsplit("-", 1)[1]) for r in records})
    assert sent[0] == set(range(0, 40, 2))
    assert sent[1] == set(range(1, 40, 2))


@pytest.mark.parametrize(
    ("name", "content", "failed", "sent"),
    [
        ("AzureLLMInferenceTrace_code.csv", AZURE_2023, "skip", 3),
        ("AzureLLMInferenceTrace_code_1week.csv", AZURE_2024, "skip", 4),
        ("BurstGPT_1.csv", BURSTGPT, "skip", 2),
        ("BurstGPT_1.csv", BURSTGPT, "keep", 3),
    ],
)
def test_a_published_trace_replays_as_downloaded(
    tmp_path: Path, name: str, content: str, failed: str, sent: int
) -> None:
    trace = tmp_path / name
    trace.write_text(content)
    spec = f"trace:{trace}" + (",failed=keep" if failed == "keep" else "")
    entries = read_trace_file(trace, failed=failed)  # type: ignore[arg-type]
    # BurstGPT's 41.5 s, 40 times as fast; Azure's under a second as it is.
    scale = 40.0 if entries.format == "burstgpt" else 1.0

    async def go() -> Any:
        # A context that takes the trace's lengths as they are (Azure's 4,808).
        config = SimConfig(host="127.0.0.1", port=0, profile="tiny", max_model_len=8192)
        async with SimServer(config) as server:
            return await run(
                "replay",
                config_for(server, tmp_path, "replay", workload=spec, rate_scale=scale),
            )

    result = asyncio.run(asyncio.wait_for(go(), 60))
    assert result.status == "completed"
    records = read_jsonl(result.path / "requests.jsonl")
    assert len(records) == sent
    by_index = {int(r["id"].rsplit("-", 1)[1]): r for r in records}
    for index, entry in enumerate(entries.entries):
        assert by_index[index]["prompt_tokens"] >= entry.prompt_tokens
    scheduled = sorted(r["scheduled_s"] for r in records)
    got = [t - scheduled[0] for t in scheduled]
    assert got == pytest.approx([e.at_s / scale for e in entries.entries], abs=1e-6)
    workload = json.loads((result.path / "run.json").read_text())["workload"]
    assert workload["trace_format"] == entries.format
    assert workload["failed_lines"] == (1 if entries.format == "burstgpt" else 0)
    assert workload["failed_lines_policy"] == failed
