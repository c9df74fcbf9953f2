"""servemon against real engines: Transformers Serve and llama.cpp's llama-server.

Run as a user runs it (``python -m servemon ramp|sweep|capacity|compare``) against
servers nobody here wrote, and check what only a real server can show: every
request ``ok`` whatever its stream grammar, TTFT to the first content (never to a
role-only chunk), tokens from ``usage``, connections llama-server closes counted as
reconnects, slots freed after cancellations, llama.cpp's series on servemon's
schema, and what the server says about each request in ``requests.jsonl``.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from servemon.monitor.config import ExporterConfig, TargetConfig
from servemon.monitor.exporter import Exporter
from tests.e2e.engines.conftest import LLAMA_API_KEY

#: The fixtures' types (conftest.Engine, conftest.Models), not imported here.
Engine = Any
Models = Any

# Whole commands against real engines on CPU: minutes, past the suite's 120 s default.
pytestmark = pytest.mark.timeout(600)

#: The seed's shape: 128 tokens in, 128 out, concurrency 1 to 8, 8 a level after 2
#: of warm-up. What the sweeps assert holds of each request, not of a level's
#: statistics: 8 a level (16 and 8 of warm-up until 2026-12-06) exercise every level
#: and cut each engine's sweep by more than half (docs/testing.md).
SEED_LEVELS = (1, 2, 4, 8)
SEED_NUMBER = 8
SEED_WARMUP = 2
SEED_SWEEP = (
    *("--parallel", *map(str, SEED_LEVELS)),
    *("--number", str(SEED_NUMBER), "--warmup", str(SEED_WARMUP)),
)
#: The requests a seed sweep records (the warm-up's are not).
SEED_REQUESTS = len(SEED_LEVELS) * SEED_NUMBER
SEED_WORKLOAD = "random:prompt=128,output=128"
RUN_TIMEOUT_S = 300


def run(servemon: Callable[..., Any], *args: str) -> tuple[Path, str]:
    """Run one servemon command to its end; its run directory and stdout."""
    cli = servemon(*args, "--out", "runs", "--metrics-port", "0")
    code = cli.wait(RUN_TIMEOUT_S)
    assert code == 0, cli.stderr[-3000:]
    for line in cli.stdout.splitlines():
        if line.startswith("run directory: "):
            path = line.removeprefix("run directory: ").rsplit(" (", 1)[0]
            return cli.stdout_path.parent / path, cli.stdout
    pytest.fail(f"no run directory in: {cli.stdout[-2000:]}")


def requests_of(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "requests.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def assert_all_ok(rows: list[dict[str, Any]], engine: Engine) -> None:
    outcomes = Counter(row["outcome"] for row in rows)
    errors = {row["error"] for row in rows if row["outcome"] != "ok"}
    assert outcomes == {"ok": len(rows)}, (outcomes, errors, engine.log_tail())


def assert_measured_honestly(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        assert row["token_source"] == "usage"
        assert row["output_tokens"] >= 1
        assert row["prompt_tokens"] > 0
        if row["ttft_s"] is None:
            # A random model's first token was its end of sequence (seen on vLLM,
            # one answer in 64): nothing was shown, so there is no first token.
            assert (row["output_tokens"], row["finish_reason"]) == (1, "stop"), row
            continue
        # TTFT is to the first content; the role-only chunk, when sent, is before.
        assert row["ttft_s"] >= row["ttfc_s"]


def metric(url: str, name: str) -> float | None:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return None


def poll(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not within {timeout_s} s")
        time.sleep(0.1)


# --- Transformers Serve ----------------------------------------------------------


def test_transformers_serve_seed_sweep_is_all_ok_and_compares_with_the_simulator(
    transformers_serve: Engine, models: Models, servemon: Callable[..., Any]
) -> None:
    tok = ("--tokenizer", str(models.tokenizer))
    real, _ = run(
        servemon,
        "sweep",
        "--target",
        transformers_serve.url,
        "--workload",
        SEED_WORKLOAD,
        *tok,
        *SEED_SWEEP,
    )
    rows = requests_of(real)
    assert len(rows) == SEED_REQUESTS
    assert_all_ok(rows, transformers_serve)
    assert_measured_honestly(rows)
    # Transformers Serve ends its streams without [DONE]: complete all the same.
    assert not any(row["done_sentinel"] for row in rows)
    assert {row["prompt_tokens"] for row in rows} == {128 + 3}  # + template markers
    summary = json.loads((real / "summary.json").read_text())
    assert summary["overall"]["without_done"] == SEED_REQUESTS
    if "--continuous-batching" in transformers_serve.proc.args:
        # With continuous batching: the comparison below reads the runs' records,
        # whatever the server's batching, so it is made once (the plain server's).
        return

    # The simulated vLLM (Qwen3-0.6B profile) ten times faster, so the level at
    # concurrency 1 takes seconds, not minutes; its ratios are not the point here.
    sim, _ = run(
        servemon,
        "sweep",
        "--workload",
        SEED_WORKLOAD,
        "--sim-arg=--speed=10",
        *SEED_SWEEP,
    )
    cli = servemon("compare", str(sim), str(real), "--out", "compare.html")
    assert cli.wait(120) == 0, cli.stderr
    page = (cli.stdout_path.parent / "compare.html").read_text()
    assert "parallel 8" in page
    # The two runs differ in what makes a ratio misleading: engine and its version.
    assert "engine configuration differs" in page


def test_transformers_serve_ramp_capacity_and_cancellations(
    transformers_serve: Engine, models: Models, servemon: Callable[..., Any]
) -> None:
    tok = ("--tokenizer", str(models.tokenizer))
    ramp, _ = run(
        servemon,
        "ramp",
        "--target",
        transformers_serve.url,
        "--stages",
        "2:4",
        "--workload",
        "random:prompt=32,output=16",
        "--cancel-fraction",
        "0.3",
        "--cancel-after-tokens",
        "3",
        "--api",
        "completions",
        *tok,
    )
    rows = requests_of(ramp)
    assert rows
    assert {row["outcome"] for row in rows} <= {"ok", "cancelled"}
    assert any(row["outcome"] == "cancelled" for row in rows)
    assert_measured_honestly([row for row in rows if row["outcome"] == "ok"])

    # No /metrics on Transformers Serve: the search runs on client figures alone.
    # The TTFT bound is loose: at 1 req/s a step judges about three requests, so
    # its p95 is their slowest; at 1 s a CI run found the SLO broken already at
    # --rps-min (no capacity; which term broke was not kept: the message now is).
    capacity, stdout = run(
        servemon,
        "capacity",
        "--target",
        transformers_serve.url,
        "--workload",
        "random:prompt=32,output=16",
        "--slo",
        "ttft_p95<=2.0,error_rate<=0.01",
        "--rps-min",
        "1",
        "--rps-max",
        "8",
        "--step-seconds",
        "4",
        "--settle",
        "1",
        "--max-duration",
        "90",
        "--precision",
        "0.5",
        *tok,
    )
    assert "capacity:" in stdout
    result = json.loads((capacity / "summary.json").read_text())
    assert result["capacity"]["capacity_rps"] is not None, stdout[-2000:]
    capacity_rows = requests_of(capacity)
    assert {row["outcome"] for row in capacity_rows} == {"ok"}


# --- llama.cpp -------------------------------------------------------------------


def test_llama_server_seed_sweep_is_all_ok_with_reconnects_counted(
    llama_server: Engine, servemon: Callable[..., Any]
) -> None:
    real, _ = run(
        servemon,
        "sweep",
        "--target",
        llama_server.url,
        "--workload",
        SEED_WORKLOAD,
        *SEED_SWEEP,
    )
    rows = requests_of(real)
    assert len(rows) == SEED_REQUESTS
    assert_all_ok(rows, llama_server)
    assert_measured_honestly(rows)
    # llama-server closes the connection after each streamed answer while it
    # advertises keep-alive: the next request on it is resent, and counted.
    summary = json.loads((real / "summary.json").read_text())
    assert summary["overall"]["reconnects"] == sum(r["reconnects"] for r in rows) > 0
    # What the server said about each request: its timings and cached tokens.
    for row in rows:
        assert row["server_source"] == "llamacpp"
        assert row["server_prefill_s"] is not None
        assert row["server_decode_s"] is not None
        assert row["cached_tokens"] is not None
        assert row["ttft_gap_s"] is not None
    # Random prompts share nothing, so the server's cache serves (almost) none.
    assert sum(r["cached_tokens"] for r in rows) < 0.1 * sum(
        r["prompt_tokens"] for r in rows
    )


def test_llama_server_capacity_reads_its_metrics(
    llama_server: Engine, servemon: Callable[..., Any]
) -> None:
    capacity, stdout = run(
        servemon,
        "capacity",
        "--target",
        llama_server.url,
        "--workload",
        "random:prompt=64,output=32",
        "--slo",
        "ttft_p95<=0.5,error_rate<=0.01",
        "--rps-min",
        "2",
        "--rps-max",
        "32",
        "--step-seconds",
        "3",
        "--settle",
        "1",
        "--max-duration",
        "60",
        "--precision",
        "0.5",
    )
    assert "capacity:" in stdout
    result = json.loads((capacity / "summary.json").read_text())
    assert result["capacity"]["capacity_rps"] is not None
    assert {row["outcome"] for row in requests_of(capacity)} == {"ok"}
    # The server's own signals were read from llama-server's /metrics.
    samples = (capacity / "server_metrics.jsonl").read_text().splitlines()
    assert samples
    assert "servemon_engine_requests_running" in samples[-1]


def test_llama_server_cancellations_free_its_slots(
    llama_server: Engine, servemon: Callable[..., Any]
) -> None:
    ramp, _ = run(
        servemon,
        "ramp",
        "--target",
        llama_server.url,
        "--stages",
        "8:3",
        "--workload",
        "random:prompt=64,output=200",
        "--ignore-eos",
        "--cancel-fraction",
        "0.5",
        "--cancel-after-tokens",
        "5",
    )
    rows = requests_of(ramp)
    assert {row["outcome"] for row in rows} <= {"ok", "cancelled"}
    assert sum(row["outcome"] == "cancelled" for row in rows) >= 3
    poll(
        lambda: metric(llama_server.url, "llamacpp:requests_processing") == 0,
        30,
        "llama-server slots freed",
    )


def test_a_run_against_llama_server_behind_an_api_key_sends_it_everywhere(
    llama_server_with_key: Engine, servemon: Callable[..., Any], tmp_path: Path
) -> None:
    """The key from ``SERVEMON_API_KEY`` goes to every call servemon makes to the
    target: the model listing (a run failed at once with ``/v1/models: HTTP
    401``), ``/tokenize`` (the prompts' lengths fell back to the estimate) and
    ``/metrics`` (the server's signals were never read), and to nothing it
    writes."""
    url = llama_server_with_key.url
    with urllib.request.urlopen(url + "/health", timeout=5) as resp:
        assert resp.status == 200
    out = tmp_path / "runs"
    cli = servemon(
        "ramp", "--target", url, "--stages", "2:4", "--out", str(out),
        "--workload", "random:prompt=32,output=8", "--metrics-port", "0",
        env={"SERVEMON_API_KEY": LLAMA_API_KEY},
    )  # fmt: skip
    assert cli.wait(RUN_TIMEOUT_S) == 0, cli.stderr[-3000:]
    (run_dir,) = list(out.iterdir())
    rows = requests_of(run_dir)
    assert rows
    assert {row["outcome"] for row in rows} == {"ok"}
    info = json.loads((run_dir / "run.json").read_text())
    assert info["workload"]["token_source"] == "server"
    assert info["server_metrics"]["scrapes"] > 0
    assert info["server_metrics"]["errors"] == 0
    assert info["server_metrics"]["engine_info"]["engine"] == "llamacpp"
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert LLAMA_API_KEY.encode() not in path.read_bytes(), path
    assert LLAMA_API_KEY not in cli.stdout + cli.stderr


async def probe_until_ok(url: str, name: str) -> dict[tuple[str, Any], float]:
    """Run an exporter with its probe on ``url`` until 3 probes were ok; its samples.

    Every probe must be ok (or, on a busy machine, timed out): a probe that met a
    closed connection or a stream without [DONE] is the bug this catches.
    """
    config = ExporterConfig(
        targets=(TargetConfig(url=url, name=name),),
        listen="127.0.0.1:0",
        gpu=False,
        probe_interval=0.5,
        # Transformers Serve's first answer with continuous batching took over
        # 30 s (the default) while other tests shared the 2 cores.
        probe_timeout=60.0,
    )
    async with (
        Exporter(config, env={}) as exp,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http,
    ):
        deadline = time.monotonic() + 90
        while True:
            async with http.get(exp.url + "/metrics") as resp:
                text = await resp.text()
            samples = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(text)
                for s in f.samples
            }
            probes = {
                dict(labels)["outcome"]: v
                for (metric_name, labels), v in samples.items()
                if metric_name == "servemon_probe_requests_total"
            }
            if probes.get("ok", 0) >= 3 or time.monotonic() > deadline:
                break
            await _sleep_a_little()
    assert probes.get("ok", 0) >= 3, text
    # A timeout is the machine, not the engine's stream: in a fresh-clone run of
    # 2026-12-05 one probe of Transformers Serve with continuous batching outlived
    # its 60 s beside the other workers' tests (3 others were ok), where the server
    # runs in a session of its own (the CPU is shared between sessions first;
    # docs/testing.md). Any other outcome fails.
    assert not {k: v for k, v in probes.items() if k not in ("ok", "timeout") and v}, (
        probes
    )
    return samples


@pytest.mark.asyncio
async def test_the_probe_on_transformers_serve_which_has_no_metrics(
    transformers_serve: Engine,
) -> None:
    samples = await probe_until_ok(transformers_serve.url, "hf")
    # No /metrics there: the target is down for the scrape, the probe still answers.
    up = [v for (name, _), v in samples.items() if name == "servemon_target_up"]
    assert up == [0.0]


@pytest.mark.asyncio
async def test_exporter_and_probe_on_a_real_llama_server(llama_server: Engine) -> None:
    samples = await probe_until_ok(llama_server.url, "llama")
    up = [v for (name, _), v in samples.items() if name == "servemon_target_up"]
    assert up == [1.0]
    engine = {
        name: dict(labels)
        for (name, labels), _ in samples.items()
        if name.startswith("servemon_engine_")
    }
    for name in (
        "servemon_engine_requests_running",
        "servemon_engine_requests_waiting",
        "servemon_engine_prompt_tokens_total",
        "servemon_engine_generation_tokens_total",
    ):
        assert name in engine, sorted(engine)
        assert engine[name]["engine"] == "llamacpp"
        assert engine[name]["target"] == "llama"


async def _sleep_a_little() -> None:
    await asyncio.sleep(0.2)  # a poll interval under the deadline above
