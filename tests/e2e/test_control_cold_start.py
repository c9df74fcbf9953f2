"""``servemon control`` from a cold start, as a new user first runs it: the signal
read through a real Prometheus (Debian's ``prometheus``) that scrapes
``servemon exporter`` in front of ``servemon sim`` every second, no
``--scrape-interval`` (the run asks Prometheus' targets API), and the default
start of 1 req/s.

Each case must reach its setpoint (a tick within ±15 %) within :data:`REACH_S` of
the start and then hold it within ±15 % in at least :data:`MIN_WITHIN` of the
ticks, their mean within :data:`MEAN_WITHIN`. The goal is 30 s and 80 %
(``benchmarks/control_hold.py --cold``, figures in ``benchmarks/results/control.md``);
the test asks the goal's 30 s and 60 % within, a margin for a busy 2-core
machine, where a load average of 6 (other workers, a vLLM server) stalls the
simulator for seconds. The queue was reached at 14-16 s, then 92-97 %. KV usage
is the weaker case: its requests live under two ticks, and Poisson arrivals
alone swing it by more than the band (a fixed rate: 66 % of 2-s windows
within), so KV usage is held with its sends paced by the requests in flight
after the start, by default (``--no-pace`` turns it off). It was reached at
36-42 s in two runs of three while the law went on from a served rate that
lagged the start's doublings, and cut the rate to a third at the hand-over;
going on from the count in flight (Little), at 20, 20, 20, 28, 20, 20 s, then
86-97 % of ticks within (six runs, 2026-12-05).
Without the start phase a queue of 48 behind the same batch (64-token requests,
about 8 req/s) was reached at 60 s (measured once, the start turned off); with
the 15 s once assumed for the scrape interval the control interval is 32 s, two
changes in the whole run.

Every process is on a free 127.0.0.1 port and stopped at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from servemon.embedded import free_port
from tests.support.alerting import PrometheusApi, prometheus_argv, prometheus_file
from tests.support.margins import Margin
from tests.support.processes import (
    READY_EXPORTER,
    READY_SIM,
    SERVEMON,
    Child,
    logs,
    read_text,
    ready_url,
    servemon_argv,
    spawn,
    stop,
    until,
)

PROMETHEUS = shutil.which("prometheus")

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        PROMETHEUS is None, reason="needs Debian's prometheus (scripts/system-deps)"
    ),
]

DURATION_S = 90.0
#: Seconds from the start by which a tick must be within ±15 % (the goal).
REACH_S = 30.0
#: The share of ticks from then on within ±15 % (goal: 0.8), and how far their
#: mean may be from the setpoint.
MIN_WITHIN = 0.6
MEAN_WITHIN = 0.25
TOLERANCE = 0.15
#: (hold, simulator flags, control flags): a queue behind a batch of 16 (requests
#: of about 7 s, so about 2 req/s at most: over a 4-s interval the arrivals' own
#: noise is about 3 of the 7 the band allows), and a cache of 1,000 blocks filled
#: by requests of a few seconds (about 16 req/s at 0.5).
CASES = {
    "waiting": (
        "waiting=48",
        ("--profile", "qwen3-0.6b-eager", "--max-num-seqs", "16"),
        ("--workload", "random:prompt=128,output=256"),
    ),
    "kv_cache_usage": (
        "kv_cache_usage=0.5",
        ("--profile", "qwen3-0.6b-eager", "--num-gpu-blocks", "1000"),
        ("--workload", "random:prompt=64,output=96", "--ignore-eos"),
    ),
}


@contextlib.asynccontextmanager
async def stack(
    folder: Path, sim_args: Sequence[str]
) -> AsyncIterator[tuple[str, str, list[Child]]]:
    """The simulator, the exporter and Prometheus; (simulator URL, Prometheus
    URL, the children) once Prometheus has the simulator's queue."""
    assert PROMETHEUS is not None
    children: list[Child] = []
    async with contextlib.AsyncExitStack() as exits:

        async def started(name: str, argv: Sequence[str]) -> Child:
            child = await spawn(name, argv, folder)
            children.append(child)
            exits.push_async_callback(stop, child)
            return child

        try:
            sim = await started(
                "sim",
                servemon_argv("sim", "--host", "127.0.0.1", "--port", "0", *sim_args),
            )
            url = await ready_url(sim, READY_SIM, 30)
            exporter = await started(
                "exporter",
                servemon_argv(
                    "exporter",
                    *("--target", f"sim={url}", "--listen", "127.0.0.1:0", "--no-gpu"),
                ),
            )
            scraped = await ready_url(exporter, READY_EXPORTER, 30)
            port = free_port()
            config = prometheus_file(
                folder / "prometheus.yml",
                jobs={"servemon": [scraped.removeprefix("http://")]},
            )
            await started(
                "prometheus",
                prometheus_argv(PROMETHEUS, config, folder, port),
            )
            timeout = aiohttp.ClientTimeout(total=5)
            async with aiohttp.ClientSession(timeout=timeout) as http:
                api = PrometheusApi(http, f"http://127.0.0.1:{port}")

                async def has_queue() -> bool:
                    for child in children:
                        child.alive()
                    return bool(await api.query("servemon_engine_requests_waiting"))

                await until(has_queue, 60, "the simulator's queue in Prometheus")
            yield url, api.url, children
        except BaseException:
            print(logs(children))  # noqa: T201
            raise


def _ticks(run_dir: Path) -> list[dict[str, Any]]:
    text = read_text(run_dir / "control.jsonl")
    return [json.loads(line) for line in text.splitlines() if line]


@pytest.mark.asyncio
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(CASES))
async def test_a_cold_start_reaches_the_setpoint_and_holds_it(
    tmp_path: Path, case: str, margin: Margin
) -> None:
    hold, sim_args, control_args = CASES[case]
    setpoint = float(hold.partition("=")[2])
    out = tmp_path / "runs"
    async with stack(tmp_path, sim_args) as (sim, prometheus, _children):
        control = await spawn(
            "control",
            [
                *SERVEMON,
                "control",
                *("--target", sim, "--prometheus", prometheus),
                *("--hold", hold, "--duration", f"{DURATION_S:g}"),
                *("--metrics-port", "0", "--out", str(out)),
                # The ticks end with the schedule; the queue the slowed simulator
                # holds then took 20 s to drain.
                *("--drain", "0"),
                *control_args,
            ],
            tmp_path,
        )
        try:
            code = await asyncio.wait_for(control.proc.wait(), DURATION_S + 60)
        except TimeoutError:
            await stop(control, signal.SIGINT, 20)
            pytest.fail(f"control still running\n{control.tail()}")
    assert code == 0, control.tail()
    (run_dir,) = out.iterdir()
    # What the run found of Prometheus' scrape interval, and from where.
    found = json.loads(read_text(run_dir / "run.json"))["server_metrics"]
    assert found["scrape_interval"]["seconds"] == 1.0, found
    assert found["scrape_interval"]["source"] == "prometheus"
    assert found["scrape_interval"]["matched_by"] == "series"
    assert found["stale_after_s"] == 2.0
    assert "behind --select every 1 s" in read_text(control.log)
    summary = json.loads(read_text(run_dir / "summary.json"))
    start = float(summary["stages"][0]["start_s"])
    # KV usage is paced unless told not to; a queue is not.
    assert summary["control"]["paced"] is (case == "kv_cache_usage"), summary

    ticks = _ticks(run_dir)
    # Both steer a count of the client's own (its prompts with no answer yet, its
    # requests in flight) that the gauge calibrates: a change every two polls.
    assert ticks[1]["t_s"] - ticks[0]["t_s"] == pytest.approx(2.0, abs=0.5)
    band = [
        t["measured"] is not None
        and abs(t["measured"] - setpoint) <= TOLERANCE * setpoint
        for t in ticks
    ]
    rows = "\n".join(
        f"{t['t_s'] - start:6.1f} {t['phase']:<5} {t['measured']} "
        f"{t['offered_rps']:.2f}"
        for t in ticks
    )
    assert True in band, rows
    first = band.index(True)
    reached = ticks[first]["t_s"] - start
    after = band[first:]
    within = sum(after) / len(after)
    print(  # noqa: T201
        f"{case}: reached at {reached:.0f} s, {within:.0%} of {len(after)} ticks "
        "within ±15 % after"
    )
    # In the JUnit XML (SERVEMON_JUNIT_DIR), what a CI run held.
    margin("reached s", reached, high=REACH_S, why=rows)
    assert len(after) >= 8, rows
    margin("within", within, low=MIN_WITHIN, why=rows)
    held = [t["measured"] for t in ticks[first:] if t["measured"] is not None]
    mean_band = {
        "low": (1 - MEAN_WITHIN) * setpoint,
        "high": (1 + MEAN_WITHIN) * setpoint,
    }
    margin("held mean", sum(held) / len(held), **mean_band, why=rows)
    phases = [t["phase"] for t in ticks]
    assert phases[0] == "start"
    assert "hold" in phases
    assert phases == sorted(phases, key=lambda p: p != "start")  # never back
