"""servemon against the engine it exists for: vLLM's CPU build (``scripts/vllm``).

One vLLM for the session (``vllm_server`` in conftest: prefix caching on, 64 KV blocks
of 128 tokens, cached tokens and per-request metrics in every answer) and servemon run
as a user runs it (``python -m servemon ...``) against it, over real sockets. What only
the real engine can show: every request ``ok`` through vLLM's own stream grammar, the
server's facts per request (queue and prefill time, cached tokens), vLLM's counters
agreeing with what the client measured at vLLM's block granularity, slots freed on
cancellation (and the aborts vLLM does not count), a capacity search reading vLLM's
``/metrics``, a pinned cache overflowing into preemptions and a queue, ``servemon
control`` holding vLLM's queue from a cold start, and the exporter and canary probe
on the live engine.

The tests share one server and run one after another, so counter deltas read around a
run belong to that run alone.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from servemon.embedded import free_port
from tests.e2e.engines.conftest import Engine, VllmModel
from tests.e2e.engines.test_real_engines import (
    SEED_LEVELS,
    SEED_REQUESTS,
    SEED_SWEEP,
    SEED_WARMUP,
    SEED_WORKLOAD,
    assert_all_ok,
    assert_measured_honestly,
    probe_until_ok,
    requests_of,
    run,
)
from tests.e2e.engines.vllm_servers import VLLM_BLOCK_SIZE, VLLM_MODEL
from tests.e2e.test_alerting_stack import PROMETHEUS
from tests.support.alerting import prometheus_argv, prometheus_file
from tests.support.margins import Margin

pytestmark = pytest.mark.timeout(600)


def vllm_samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of vLLM's ``/metrics`` by (name, sorted labels)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: dict[tuple[str, Any], float], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(
        value
        for (sample, sample_labels), value in samples.items()
        if sample == name and labels.items() <= dict(sample_labels).items()
    )


def delta(
    before: dict[tuple[str, Any], float],
    after: dict[tuple[str, Any], float],
    name: str,
    **labels: str,
) -> float:
    return total(after, name, **labels) - total(before, name, **labels)


def wait_idle(url: str, timeout_s: float = 60) -> dict[tuple[str, Any], float]:
    """Poll until vLLM runs and queues nothing (the last run's requests are all
    finished or aborted); its samples then."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = vllm_samples(url)
        busy = total(samples, "vllm:num_requests_running") + total(
            samples, "vllm:num_requests_waiting"
        )
        if busy == 0:
            return samples
        if time.monotonic() > deadline:
            pytest.fail(f"vLLM still busy after {timeout_s} s: {busy}")
        time.sleep(0.2)  # a poll interval under a deadline


def tok(model: VllmModel) -> tuple[str, str]:
    return ("--tokenizer", str(model.tokenizer))


# --- the seed's sweep, and what vLLM says of each request ------------------------


def test_vllm_seed_sweep_is_all_ok_with_the_servers_facts_per_request(
    vllm_server: Engine, vllm_model: VllmModel, servemon: Callable[..., Any]
) -> None:
    before = wait_idle(vllm_server.url)
    real, _ = run(
        servemon,
        "sweep",
        "--target",
        vllm_server.url,
        "--workload",
        SEED_WORKLOAD,
        *tok(vllm_model),
        *SEED_SWEEP,
    )
    after = wait_idle(vllm_server.url)
    rows = requests_of(real)
    assert len(rows) == SEED_REQUESTS
    assert_all_ok(rows, vllm_server)
    assert_measured_honestly(rows)
    # vLLM sends [DONE], and the role-only chunk first (TTFT is after it).
    assert all(row["done_sentinel"] for row in rows)
    # 128 words of servemon's pool are 128 tokens; the chat template adds its own.
    assert {row["prompt_tokens"] for row in rows} == {128 + 3}
    for row in rows:
        # --enable-per-request-metrics: queue and prefill as the engine timed them,
        # inside what the client waited.
        assert row["server_source"] == "vllm"
        assert row["server_queue_s"] is not None
        assert row["server_prefill_s"] is not None
        assert row["server_queue_s"] + row["server_prefill_s"] <= row["ttft_s"]
        assert row["ttft_gap_s"] is not None
        assert row["ttft_gap_s"] >= 0
        assert row["cached_tokens"] is not None
    # `random` stays uncached on the real engine: every prompt is distinct from
    # its first tokens on, so no 128-token block is ever a hit.
    assert sum(row["cached_tokens"] for row in rows) == 0
    # The measured and each level's warm-up were all the server saw, and it counted
    # at least the tokens the client was sent.
    assert delta(before, after, "vllm:request_success_total") == (
        SEED_REQUESTS + len(SEED_LEVELS) * SEED_WARMUP
    )
    assert delta(before, after, "vllm:generation_tokens_total") >= sum(
        row["output_tokens"] for row in rows
    )
    summary = json.loads((real / "summary.json").read_text())
    assert summary["overall"]["outcomes"] == {"ok": SEED_REQUESTS}


# --- the prefix cache, as vLLM keeps it ------------------------------------------


def assert_cached_tokens_agree(
    rows: list[dict[str, Any]],
    before: dict[tuple[str, Any], float],
    after: dict[tuple[str, Any], float],
) -> float:
    """Per-request cached tokens sum to vLLM's hit counter, in whole blocks; the
    hit ratio of the prompt tokens."""
    cached = [row["cached_tokens"] for row in rows]
    assert all(c is not None and c % VLLM_BLOCK_SIZE == 0 for c in cached), cached
    hits = delta(before, after, "vllm:prefix_cache_hits_total")
    queries = delta(before, after, "vllm:prefix_cache_queries_total")
    prompt = sum(row["prompt_tokens"] for row in rows)
    assert hits == sum(cached)
    assert queries == prompt
    return hits / queries


def test_vllm_shared_prefix_hits_agree_with_its_counters(
    vllm_server: Engine, vllm_model: VllmModel, servemon: Callable[..., Any]
) -> None:
    before = wait_idle(vllm_server.url)
    # 4 prefixes of 512 words (4 blocks each with the template's first token),
    # each sent with a distinct 40-word suffix.
    ramp, _ = run(
        servemon,
        "ramp",
        "--target",
        vllm_server.url,
        "--stages",
        "4:6",
        "--workload",
        "shared-prefix:prefix=512,prompts=4,suffix=40,output=4",
        *tok(vllm_model),
    )
    after = wait_idle(vllm_server.url)
    rows = requests_of(ramp)
    assert_all_ok(rows, vllm_server)
    ratio = assert_cached_tokens_agree(rows, before, after)
    # Every request after a prefix's first hits its 4 whole blocks (512 tokens of
    # the 513 shared: the template's first token and 511 of the prefix's words).
    # Only a prefix's first requests miss (two sent before the first's prefill is
    # done both compute it).
    hit_rows = [row for row in rows if row["cached_tokens"]]
    assert len(hit_rows) >= len(rows) - 8
    assert {row["cached_tokens"] for row in hit_rows} == {4 * VLLM_BLOCK_SIZE}
    assert ratio > 0.5


@pytest.mark.parametrize("hit", [0.2, 0.5, 0.8])
def test_vllm_meets_an_asked_prefix_hit_rate_on_its_own_counters(
    vllm_server: Engine,
    vllm_model: VllmModel,
    servemon: Callable[..., Any],
    hit: float,
) -> None:
    # 2,048 content tokens and vLLM's 128-token blocks: the nearest whole blocks
    # are 3, 8 and 13 (0.19, 0.50, 0.81 of about 2,051). Two groups of at most 13
    # blocks stay under half the 64-block cache.
    before = wait_idle(vllm_server.url)
    ramp, _ = run(
        servemon,
        "ramp",
        "--target",
        vllm_server.url,
        # 6 requests: each hits its group's whole prefix blocks, so the rate is the
        # same for any count (12 until 2026-12-06).
        "--stages",
        "1:6",
        "--arrival",
        "constant",
        "--workload",
        f"prefix:hit={hit},prompt=2048,groups=2,output=4",
        # A seed of its own: prefixes of another case's seed would already be
        # in the cache, and the warm prompts would hit them.
        "--seed",
        str(round(hit * 10)),
        *tok(vllm_model),
    )
    after = wait_idle(vllm_server.url)
    rows = requests_of(ramp)
    assert_all_ok(rows, vllm_server)
    recorded = json.loads((ramp / "run.json").read_text())["workload"]
    assert recorded["block_size"] == VLLM_BLOCK_SIZE
    assert recorded["block_source"] == "cache_config_info"
    assert recorded["overhead_source"] == "tokenize"
    (server_tokens,) = {row["prompt_tokens"] for row in rows}
    assert server_tokens == (
        2048 + recorded["overhead_tokens"] + recorded["tail_tokens"]
    )
    hits = delta(before, after, "vllm:prefix_cache_hits_total")
    queries = delta(before, after, "vllm:prefix_cache_queries_total")
    # The two warm prompts went first, unrecorded, and hit nothing.
    assert queries == (len(rows) + 2) * server_tokens
    assert hits == sum(row["cached_tokens"] for row in rows)
    measured = hits / (len(rows) * server_tokens)
    assert abs(measured - hit) <= 0.03, (measured, recorded)
    assert measured == pytest.approx(recorded["expected_hit"], abs=1e-6)
    # The run read the same counters around its stage, and recorded the rate.
    (stage,) = json.loads((ramp / "summary.json").read_text())["stages"]
    assert abs(stage["server_hit_rate"] - hit) <= 0.03, stage["server_hit_rate"]


def test_vllm_trace_replay_and_sessions_hits_agree_with_its_counters(
    vllm_server: Engine,
    vllm_model: VllmModel,
    servemon: Callable[..., Any],
    tmp_path: Path,
) -> None:
    # A Mooncake trace: two requests per system prompt, the second sharing its
    # first 2 blocks of 512 tokens (hash ids 1, 2) and adding one of its own.
    trace = tmp_path / "trace.jsonl"
    lines = []
    for i in range(6):
        system = [10 * (i // 2) + 1, 10 * (i // 2) + 2]
        lines.append(
            {
                "timestamp": 300 * i,
                "input_length": 1536,
                "output_length": 4,
                "hash_ids": [*system, 1000 + i],
            }
        )
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    before = wait_idle(vllm_server.url)
    replay, _ = run(
        servemon, "replay", str(trace), "--target", vllm_server.url, *tok(vllm_model)
    )
    after = wait_idle(vllm_server.url)
    rows = requests_of(replay)
    assert len(rows) == 6
    assert_all_ok(rows, vllm_server)
    assert_cached_tokens_agree(rows, before, after)
    # The second of each pair shares the template's first token and 1,024 words:
    # its first 8 blocks are hits; the first of each pair has none.
    ordered = sorted(rows, key=lambda r: r["scheduled_s"])
    assert [r["cached_tokens"] for r in ordered] == [0, 8 * VLLM_BLOCK_SIZE] * 3

    # Multi-turn sessions: each turn resends the history, which vLLM serves from
    # its cache in whole blocks.
    before = wait_idle(vllm_server.url)
    sessions, _ = run(
        servemon,
        "ramp",
        "--target",
        vllm_server.url,
        "--stages",
        "1:4",
        "--workload",
        "sessions:turns=3,think=0.2,system=0,first=600,user=20,output=8,answer=filler",
        *tok(vllm_model),
    )
    after = wait_idle(vllm_server.url)
    turns = requests_of(sessions)
    assert_all_ok(turns, vllm_server)
    assert_cached_tokens_agree(turns, before, after)
    later = [t for t in turns if t["turn"] > 1]
    assert later
    for t in later:
        # The history is at least the 600-word opening: 4 whole blocks.
        assert t["cached_tokens"] >= 4 * VLLM_BLOCK_SIZE, t


# --- cancellations, capacity and cache pressure ----------------------------------


def test_vllm_counts_the_aborts_of_cancelled_requests_and_frees_their_slots(
    vllm_server: Engine, vllm_model: VllmModel, servemon: Callable[..., Any]
) -> None:
    before = wait_idle(vllm_server.url)
    ramp, _ = run(
        servemon,
        "ramp",
        "--target",
        vllm_server.url,
        "--stages",
        "6:3",
        "--workload",
        "random:prompt=64,output=300",
        "--ignore-eos",
        "--cancel-fraction",
        "0.5",
        "--cancel-after-tokens",
        "5",
        *tok(vllm_model),
    )
    rows = requests_of(ramp)
    outcomes = Counter(row["outcome"] for row in rows)
    assert set(outcomes) <= {"ok", "cancelled"}, outcomes
    assert outcomes["cancelled"] >= 3
    # Slots freed: nothing left running or waiting once the client walked away.
    after = wait_idle(vllm_server.url, timeout_s=30)
    # vLLM counts the requests it finished. A request the client aborts mid-stream
    # leaves through OutputProcessor.abort_requests, which drops its state without
    # the finished-request stats: request_success_total{finished_reason="abort"}
    # misses it (0.32.0; the counter's delta is the ok requests and at most the
    # few whose abort raced their last output).
    finished = delta(before, after, "vllm:request_success_total")
    assert outcomes["ok"] <= finished <= len(rows)
    assert finished - outcomes["ok"] < outcomes["cancelled"]


def test_vllm_capacity_search_reads_its_metrics(
    vllm_server: Engine, vllm_model: VllmModel, servemon: Callable[..., Any]
) -> None:
    wait_idle(vllm_server.url)
    capacity, stdout = run(
        servemon,
        "capacity",
        "--target",
        vllm_server.url,
        "--workload",
        # Answers long enough that the 16 slots fill within --rps-max: with 64
        # tokens, vLLM alone on the 2 cores met the SLO at 64 req/s (2026-12-04).
        "random:prompt=256,output=256",
        # An SLO that only a saturated server breaks: at 0.5 s, a busy 2-core
        # machine's vLLM broke it at 8-16 req/s from compute alone, with no queue
        # and its batch not yet full (the search then rightly says "none"); at 1.5 s the
        # breach comes where its 16 slots are full or the client cannot keep up.
        # Two tiers in one search (#44): the strict one found first, the loose one
        # from the steps already measured and the few it adds.
        "--slo",
        "strict=ttft_p95<=1.5,error_rate<=0.01",
        "--slo",
        "loose=ttft_p95<=3,error_rate<=0.01",
        # From 4 req/s (8 met the strict SLO in every run), to within a factor
        # of 2: what this test reads is the search's figures and vLLM's gauges,
        # not a close bracket (the search's bisection has tests of its own).
        "--rps-min",
        "4",
        "--rps-max",
        "64",
        "--step-seconds",
        "4",
        "--settle",
        "1",
        "--max-duration",
        "120",
        "--precision",
        "1",
        *tok(vllm_model),
    )
    assert "capacity:" in stdout
    result = json.loads((capacity / "summary.json").read_text())
    found = result["capacity"]
    assert found["capacity_rps"] is not None
    # Something broke within 64 req/s on 2 CPU cores, and the search says what the
    # server ran out of from vLLM's own gauges.
    assert found["first_breach"], found
    assert found["saturated_first"] in {"queue", "kv_cache", "client"}, found
    strict, loose = found["tiers"]
    assert (strict["name"], loose["name"]) == ("strict", "loose")
    assert strict["capacity_rps"] == found["capacity_rps"]
    # The loose tier meets at least the rate the strict one met, and no rate was
    # measured twice for it.
    assert loose["capacity_rps"] is not None
    assert loose["capacity_rps"] >= strict["capacity_rps"]
    rates = [step["rate"] for step in found["steps"]]
    assert len(rates) == len(set(rates)), rates
    samples = (capacity / "server_metrics.jsonl").read_text().splitlines()
    assert samples
    last = samples[-1]
    for name in (
        "servemon_engine_requests_waiting",
        "servemon_engine_kv_cache_usage_ratio",
        "servemon_engine_prefix_cache_queries_total",
    ):
        assert name in last


def test_vllm_cache_pressure_shows_preemptions_a_full_cache_and_a_queue(
    vllm_server: Engine, vllm_model: VllmModel, servemon: Callable[..., Any]
) -> None:
    before = wait_idle(vllm_server.url)
    # 16 sequences of 1,024 prompt and 512 answer tokens want 24,576 tokens of KV
    # cache; vLLM was given 8,192. It admits what fits, then preempts as decodes
    # grow, and the rest wait.
    ramp, _ = run(
        servemon,
        "ramp",
        "--target",
        vllm_server.url,
        "--stages",
        "8:3",
        "--workload",
        "random:prompt=1024,output=512",
        "--ignore-eos",
        *tok(vllm_model),
    )
    after = wait_idle(vllm_server.url, timeout_s=120)
    rows = requests_of(ramp)
    assert_all_ok(rows, vllm_server)
    assert delta(before, after, "vllm:num_preemptions_total") > 0
    series: dict[str, list[float]] = {}
    for line in (ramp / "server_metrics.jsonl").read_text().splitlines():
        sample = json.loads(line)
        for name, value in _values(sample).items():
            series.setdefault(name, []).append(value)
    assert max(series["servemon_engine_kv_cache_usage_ratio"]) > 0.85, series
    assert max(series["servemon_engine_requests_waiting"]) >= 2, series
    summary = json.loads((ramp / "summary.json").read_text())
    assert summary["overall"]["outcomes"] == {"ok": len(rows)}


def _values(sample: dict[str, Any]) -> dict[str, float]:
    """A ``server_metrics.jsonl`` line's values, summed over label sets."""
    out: dict[str, float] = {}
    for name, _labels, value in sample.get("samples", []):
        out[name] = out.get(name, 0.0) + float(value)
    return out


# --- the controller on the real scheduler ----------------------------------------


def reached(tick: dict[str, Any], setpoint: float) -> bool:
    """The signal, rising from nothing, is in the band of +-15 % or past it."""
    measured = tick.get("measured")
    return measured is not None and measured >= 0.85 * setpoint


def control_ticks(
    servemon: Callable[..., Any],
    url: str,
    model: VllmModel,
    hold: str,
    duration: str,
    workload: str,
    *,
    prometheus: str | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``servemon control --hold HOLD`` against ``url`` (answers of their full
    length), reading vLLM's ``/metrics`` every 0.5 s or ``prometheus`` (polled every
    second); every tick, and the ticks from the reach on: the first tick in the
    band of +-15 % or past it (the signal rises from nothing). Until 2026-12-06 the
    reach was the first tick within the band, and a fresh clone's KV-usage run
    that rose from 0.345 to 0.593 between two ticks (16 s; 0.5 +- 0.075) and
    overshot to 0.751 before it settled was called reached at 32 s, not 16: an
    overshoot is the hold's to answer for (its ticks count as not within)."""
    setpoint = float(hold.partition("=")[2])
    source = (
        ("--sample-interval", "0.5")
        if prometheus is None
        else ("--prometheus", prometheus)
    )
    control, _ = run(
        servemon,
        "control",
        *("--target", url, "--hold", hold, "--duration", duration),
        # The ticks end with the schedule; the queue left (96 waiting: 11 s) is
        # cut rather than drained.
        *("--drain", "0"),
        *source,
        *("--workload", workload, "--ignore-eos"),
        *tok(model),
    )
    ticks = [
        json.loads(line)
        for line in (control / "control.jsonl").read_text().splitlines()
        if line.strip()
    ]
    first = next((i for i, t in enumerate(ticks) if reached(t, setpoint)), None)
    assert first is not None, ticks
    return ticks, ticks[first:]


@contextlib.contextmanager
def prometheus_over(
    servemon: Callable[..., Any], url: str, folder: Path
) -> Iterator[str]:
    """``servemon exporter`` in front of the vLLM at ``url`` and Debian's Prometheus
    scraping it every second, both in pytest's session as vLLM is; yields
    Prometheus' URL once it has vLLM's KV usage, and stops Prometheus after."""
    assert PROMETHEUS is not None
    exporter = free_port()
    servemon(
        "exporter",
        *("--target", f"vllm={url}", "--listen", f"127.0.0.1:{exporter}", "--no-gpu"),
    )
    port = free_port()
    config = prometheus_file(
        folder / "prometheus.yml", jobs={"servemon": [f"127.0.0.1:{exporter}"]}
    )
    with (folder / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(
            prometheus_argv(PROMETHEUS, config, folder, port),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    query = f"{base}/api/v1/query?query=servemon_engine_kv_cache_usage_ratio"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (folder / "prometheus.log").read_text()
            with (
                contextlib.suppress(OSError, ValueError),
                urllib.request.urlopen(query, timeout=2) as answer,
            ):
                if json.load(answer)["data"]["result"]:
                    break
            if time.monotonic() > deadline:
                pytest.fail("Prometheus has no KV usage of vLLM after 60 s")
            time.sleep(0.5)  # a poll interval under a deadline
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def within(tick: dict[str, Any], setpoint: float) -> bool:
    measured = tick.get("measured")
    return measured is not None and abs(measured - setpoint) <= 0.15 * setpoint


def held_through_prometheus(
    servemon: Callable[..., Any],
    url: str,
    model: VllmModel,
    run: tuple[str, str, str],
    folder: Path,
    margin: Margin,
    low: float,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """:func:`control_ticks` for ``run`` (hold, duration, workload) with the signal
    read through :func:`prometheus_over`: every tick, the ticks from the reach on,
    and the share of those within +-15 %, which it prints and holds to ``low``
    (both recorded in the JUnit XML: ``SERVEMON_JUNIT_DIR``)."""
    hold, duration, workload = run
    with prometheus_over(servemon, url, folder) as prometheus:
        ticks, after = control_ticks(
            servemon, url, model, hold, duration, workload, prometheus=prometheus
        )
    setpoint = float(hold.partition("=")[2])
    held = sum(within(t, setpoint) for t in after) / len(after)
    signal = hold.partition("=")[0]
    print(f"{signal}: {held:.0%} of {len(after)} ticks within after")  # noqa: T201
    margin("reached s", after[0]["t_s"], high=30, why=ticks)  # issue 27's goal
    margin("within", held, low=low, why=ticks)
    return ticks, after


@pytest.mark.skipif(PROMETHEUS is None, reason="needs Debian's prometheus")
def test_control_holds_vllms_queue_through_prometheus(
    vllm_server: Engine,
    vllm_model: VllmModel,
    servemon: Callable[..., Any],
    tmp_path: Path,
    margin: Margin,
) -> None:
    """A queue that is a signal: 16 slots always busy, no preemption (64 + 300
    tokens hold 3 of the 64 blocks, 48 for 16), and a setpoint large beside a
    tick's arrivals (about 28 req/s are served: 28 +- 5 a 1-s tick against a band
    of +-14). A small setpoint with long prompts (4, with 512 + 128 tokens: the KV
    cache full at 12 requests, preempting) swings from 0 to 46 between ticks.

    Read as a fleet's user reads it, through a Prometheus scraping ``servemon
    exporter`` every second: the law steers the client's own prompts with no
    answer yet, which the gauge calibrates. The goal: the setpoint within 30 s, then
    80 % of the ticks within +-15 %; the test asks 70 % over 45 s (from a reach at
    16 s, 15 ticks of 2 s: four blind ticks still pass; figures in
    docs/testing.md, "What the vLLM tier's holds last")."""
    wait_idle(vllm_server.url)
    ticks, after = held_through_prometheus(
        servemon,
        vllm_server.url,
        vllm_model,
        ("waiting=96", "45", "random:prompt=64,output=300"),
        tmp_path,
        margin,
        0.7,
    )
    # The law steered the client's count, calibrated by the gauge.
    assert any(t["steered"] is not None for t in after), ticks


@pytest.mark.skipif(PROMETHEUS is None, reason="needs Debian's prometheus")
def test_control_holds_vllms_kv_cache_through_prometheus(
    vllm_large_cache: Engine,
    vllm_model: VllmModel,
    servemon: Callable[..., Any],
    tmp_path: Path,
    margin: Margin,
) -> None:
    """Half of a cache of 1,024 blocks: about 130 requests of 256 + 300 tokens in
    flight, past the knee of this CPU, where each request sent slows the others. The
    law holds the count in flight that holds the setpoint, its sends paced by the
    requests in flight (the default for KV usage), and says so in each tick; the
    signal is read as a fleet's user reads it, through a Prometheus that scrapes
    ``servemon exporter`` every second.

    The goal is the setpoint within 30 s, then 80 % of the ticks within +-15 %. The
    test asks the 30 s, half the ticks within (this law's spread sits above, a law
    that predicted from the rate held 17 %), the mean within the band and never a
    full cache, over 90 s: the hold's length and the figures behind the bound are in
    docs/testing.md ("What the vLLM tier's holds last") and
    benchmarks/results/control.md."""
    ticks, after = held_through_prometheus(
        servemon,
        vllm_large_cache.url,
        vllm_model,
        ("kv_cache_usage=0.5", "90", "random:prompt=256,output=300"),
        tmp_path,
        margin,
        0.5,
    )
    measured = [t["measured"] for t in after if t["measured"] is not None]
    mean = sum(measured) / len(measured)
    margin("held mean", mean, low=0.5 * 0.85, high=0.5 * 1.15, why=measured)
    # Steered on the client's count: about 130 in flight wanted, none preempted.
    wanted = [t["in_flight_wanted"] for t in after]
    assert all(w is not None and 80 < w < 200 for w in wanted), wanted
    assert max(t["measured"] or 0 for t in ticks) < 0.95, ticks
    assert any(t["pace"] is not None for t in after), "KV usage is paced by default"


# --- the exporter and the probe on the live engine -------------------------------


@pytest.mark.asyncio
async def test_exporter_and_probe_on_a_real_vllm(vllm_server: Engine) -> None:
    samples = await probe_until_ok(vllm_server.url, "vllm")
    up = [v for (name, _), v in samples.items() if name == "servemon_target_up"]
    assert up == [1.0]
    info = [
        dict(labels)
        for (name, labels), _ in samples.items()
        if name == "servemon_engine_info"
    ]
    assert len(info) == 1, info
    assert info[0]["engine"] == "vllm"
    assert info[0]["version"] == "0.32.0"
    assert info[0]["block_size"] == str(VLLM_BLOCK_SIZE)
    assert info[0]["prefix_caching"] == "True"
    engine = {
        name: dict(labels)
        for (name, labels), _ in samples.items()
        if name.startswith("servemon_engine_")
    }
    for name in (
        "servemon_engine_requests_running",
        "servemon_engine_requests_waiting",
        "servemon_engine_kv_cache_usage_ratio",
        "servemon_engine_prefix_cache_queries_total",
        "servemon_engine_prefix_cache_hits_total",
        "servemon_engine_preemptions_total",
        "servemon_engine_prompt_tokens_total",
        "servemon_engine_generation_tokens_total",
        "servemon_engine_requests_finished_total",
        "servemon_engine_ttft_seconds_bucket",
        "servemon_engine_queue_seconds_bucket",
    ):
        assert name in engine, sorted(engine)
        assert engine[name]["engine"] == "vllm"
        assert engine[name]["model"] == VLLM_MODEL
