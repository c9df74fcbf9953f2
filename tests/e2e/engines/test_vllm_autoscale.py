"""``servemon autoscale``'s threshold on the real vLLM: the scaling-fleet check of
``tests/e2e/test_autoscale_fleet.py`` as far as two vLLM CPU servers on this
machine's two cores allow.

1. ``servemon capacity`` on the session's small vLLM (16 slots) finds its capacity
   C and what saturated first (its queue), reading vLLM's own ``/metrics``.
2. ``servemon autoscale --vllm-names --select 'job="vllms"' --pod-label instance``
   writes the rule and the threshold (the queue where the SLO reached its limit,
   less 20 %), and Debian's Prometheus evaluates that rule on vLLM's own
   ``vllm:num_requests_waiting``, scraped every second.
3. A seeded ramp through nginx (0.6 C, then 1.5 C: a rise and a judged hold)
   while the test's HPA rule (:class:`tests.support.autoscaling.HorizontalRule`,
   1-2 replicas) reads the generated KEDA trigger's query every second.

The second replica is the session's other vLLM (``vllm_large_cache``), already
serving: starting a vLLM on demand takes 32-40 s on these cores (conftest), longer
than the ramp, so a replica "added" here is one routed by nginx and scraped by
Prometheus from the moment the scaler asks for 2
(:class:`tests.support.autoscaling.StandbyFleet`), as a pod that is already warm.

What this proves, and what it does not: the threshold generated from vLLM's own
gauge (read by the capacity search from vLLM's ``/metrics``, by the scaler through
Prometheus) makes the scaler leave the second replica alone at 0.6 C and route it
once the load passes one server's capacity, before the judged hold stage. It does
not prove that the second replica keeps the SLO: both vLLMs share this machine's
two cores with the load generator, nginx and Prometheus (and, here, other
sessions' tests), so a second server adds no compute. Measured in 2 runs
(2026-12-06, load average 6-10, with an 8 s rise): C = 8 req/s, thresholds 1.52
and 1.81; the second server was routed 3.9 and 6.6 s into the 1.5 C rise (now
10 s), and the pair then kept 13 % and 20 % of the hold stage's requests within
the SLO (TTFT p95 6.7-13.6 s). The 95 % goodput after a
scale-up is shown on the simulator fleet (``tests/e2e/test_autoscale_fleet.py``),
where replicas do not compete for the cores; here the test prints the goodput and
asserts only the scaler's timing. About 85 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from servemon.embedded import free_port
from tests.e2e.engines.conftest import Engine, VllmModel
from tests.e2e.engines.test_real_engines import run
from tests.e2e.engines.test_vllm import tok, wait_idle
from tests.e2e.test_alerting_stack import PROMETHEUS
from tests.support.alerting import PrometheusApi, prometheus_argv, prometheus_file
from tests.support.autoscaling import (
    HorizontalRule,
    Scaler,
    StandbyFleet,
    read_decisions,
    write_targets,
)
from tests.support.nginx import NGINX, nginx_argv, nginx_file
from tests.support.processes import Child, spawn, stop, until

pytestmark = [
    # The first vLLM test of a session waits for its start (1.5-2.5 min, conftest).
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        PROMETHEUS is None or NGINX is None,
        reason="needs Debian's prometheus and nginx (scripts/system-deps)",
    ),
]

WORKLOAD = "random:prompt=64,output=300"
SLO = "ttft_p95<=1"
SEARCH = (
    *("--slo", SLO, "--workload", WORKLOAD, "--arrival", "poisson"),
    *("--rps-min", "8", "--step-seconds", "4", "--settle", "1"),
    *("--precision", "0.25", "--max-duration", "30", "--seed", "1"),
    *("--sample-interval", "0.25"),
)
WINDOW = "5s"
TICK_S = 1.0
#: The ramp: (multiple of C, seconds, role).
RAMP = ((0.6, 6, "hold"), (1.5, 10, "rise"), (1.5, 8, "hold"))


@contextlib.asynccontextmanager
async def balanced(
    folder: Path, first: str, rules: Path
) -> AsyncIterator[tuple[Child, int, Path, str]]:
    """nginx over ``first`` (host:port) and Prometheus scraping the routed servers
    as job ``vllms`` and evaluating ``rules``: (nginx, its port, the file_sd file,
    Prometheus' URL); both stopped after."""
    assert PROMETHEUS is not None
    nginx_dir = folder / "nginx"
    nginx_dir.mkdir()
    port = free_port()
    conf = nginx_file(nginx_dir, f"127.0.0.1:{port}", [(first, 1)])
    sd_file = folder / "vllms.json"
    write_targets(sd_file, [first])
    prom_port = free_port()
    config = prometheus_file(
        folder / "prometheus.yml",
        rules=[rules],
        jobs={},
        file_jobs={"vllms": sd_file},
    )
    nginx = await spawn("nginx", nginx_argv(nginx_dir, conf), folder)
    prometheus = await spawn(
        "prometheus",
        prometheus_argv(PROMETHEUS, config, folder, prom_port),
        folder,
    )
    try:
        yield nginx, port, sd_file, f"http://127.0.0.1:{prom_port}"
    finally:
        await stop(prometheus)
        await stop(nginx)


def generated(servemon: Callable[..., Any], run_dir: Path, out: Path) -> Any:
    """``servemon autoscale``'s files for the vLLM fleet, as YAML; fails with its
    stderr."""
    cli = servemon(
        "autoscale",
        str(run_dir),
        *("--target-ref", "deployment/vllm", "--vllm-names"),
        *("--select", 'job="vllms"', "--pod-label", "instance"),
        *("--window", WINDOW, "--max-replicas", "2", "--scale-down-window", "60"),
        *("--out", str(out)),
    )
    assert cli.wait(60) == 0, cli.stderr[-2000:]
    text = (out / "hpa.yaml").read_text(encoding="utf-8")
    sys.stderr.write("".join(f"{x}\n" for x in text.splitlines() if x[:2] == "# "))
    return yaml.safe_load(text)


def stage_figures(run_dir: Path) -> list[dict[str, Any]]:
    """Each ramp stage's offered rate, good share, TTFT p95 and times."""
    summary = json.loads((run_dir / "summary.json").read_text())
    run_info = json.loads((run_dir / "run.json").read_text())
    origin = float(run_info["clock_origin"]["monotonic_s"])
    out = []
    for stage in summary["stages"]:
        figures = stage["summary"]
        offered = stage["sent"] / figures["duration_s"]
        out.append(
            {
                "offered_rps": offered,
                "good_share": figures["goodput"] / offered,
                "ok_rps": figures["request_throughput"],
                "ttft_p95": (figures.get("ttft") or {}).get("p95"),
                "start": origin + stage["start_s"],
                "end": origin + stage["end_s"],
            }
        )
    return out


@pytest.mark.asyncio
async def test_vllms_generated_threshold_adds_the_second_server_in_time(
    vllm_server: Engine,
    vllm_large_cache: Engine,
    vllm_model: VllmModel,
    servemon: Callable[..., Any],
    tmp_path: Path,
) -> None:
    began = time.monotonic()
    servers = (vllm_server, vllm_large_cache)
    for server in servers:
        wait_idle(server.url)
    capacity, _ = run(
        servemon, "capacity", "--target", vllm_server.url, *SEARCH, *tok(vllm_model)
    )
    found = json.loads((capacity / "summary.json").read_text())["capacity"]
    steps = ", ".join(
        f"{s['rate']:g}{'+' if s['good'] else '-'}" for s in found["steps"]
    )
    sys.stderr.write(
        f"vLLM capacity {found['capacity_rps']} req/s, {found['saturated_first']} "
        f"saturated first; steps {steps}\n"
    )
    assert found["capacity_rps"] is not None, found
    assert found["saturated_first"] == "queue", found
    c = float(found["capacity_rps"])
    hpa = generated(servemon, capacity, tmp_path / "autoscale")
    threshold = float(hpa["spec"]["metrics"][0]["external"]["target"]["value"])
    keda = yaml.safe_load(
        (tmp_path / "autoscale" / "keda-scaledobject.yaml").read_text()
    )
    query = keda["spec"]["triggers"][0]["metadata"]["query"]
    addresses = [s.url.removeprefix("http://") for s in servers]

    def check() -> None:
        for server in servers:
            assert server.proc.poll() is None, server.log_tail()

    timeout = aiohttp.ClientTimeout(total=10, sock_connect=2)
    async with (
        aiohttp.ClientSession(timeout=timeout, trust_env=False) as http,
        balanced(
            tmp_path, addresses[0], tmp_path / "autoscale" / "autoscale-rules.yaml"
        ) as (nginx, port, sd_file, prom_url),
    ):
        prometheus = PrometheusApi(http, prom_url)
        fleet = StandbyFleet(tmp_path / "nginx", nginx, port, sd_file, addresses, check)

        async def recorded() -> bool:
            fleet.alive()
            found = await prometheus.query(query)
            return bool(found) and float(found[0]["value"][1]) == 0

        await until(recorded, 30, "the recording rule's series, idle")
        stages = ",".join(f"{k * c:.2f}:{secs}" for k, secs, _ in RAMP)
        ramp = servemon(
            "ramp",
            *("--target", f"http://127.0.0.1:{port}", "--target-name", "fleet"),
            *("--stages", stages, "--arrival", "poisson", "--seed", "3"),
            # What 1.5 C queued is cut at the end (its drain took 13 s): the
            # scaler's decisions are all made by then.
            *("--drain", "0"),
            *("--slo", SLO, "--workload", WORKLOAD, *tok(vllm_model)),
            *("--out", "runs", "--metrics-port", "0"),
        )
        rule = HorizontalRule(target=threshold, max_replicas=2, scale_down_window_s=60)
        log = tmp_path / "scaler.jsonl"
        scaler = Scaler(prometheus, query, rule, fleet, log, TICK_S)
        done = asyncio.Event()
        task = asyncio.ensure_future(scaler.run(done))
        try:
            planned = sum(seconds for _, seconds, _ in RAMP)
            code = await asyncio.to_thread(ramp.wait, planned + 60)
        finally:
            done.set()
            await task
    assert code == 0, ramp.stderr[-2000:]
    run_dir = next(
        ramp.stdout_path.parent / line.removeprefix("run directory: ").rsplit(" (")[0]
        for line in ramp.stdout.splitlines()
        if line.startswith("run directory: ")
    )
    decisions = read_decisions(log)
    figures = stage_figures(run_dir)
    desired = "".join(str(d.desired) for d in decisions)
    added = next((d.mono_s for d in decisions if d.ready == 2), None)
    sys.stderr.write(
        f"threshold {threshold:g}; desired per tick {desired}; second server routed "
        + (
            "never"
            if added is None
            else f"{added - figures[1]['start']:.1f} s into 1.5 C"
        )
        + "; "
        + "; ".join(
            f"{k:g}C {role} {f['offered_rps']:.1f} rps ok {f['ok_rps']:.1f} "
            f"good {f['good_share']:.2f} ttft_p95 {f['ttft_p95']}"
            for (k, _, role), f in zip(RAMP, figures, strict=True)
        )
        + f"; {time.monotonic() - began:.0f} s in all\n"
    )
    # One server at 0.6 C: no second one asked for. Its goodput is printed, not
    # held: a 4-s step can judge a rate good before its queue has formed, and a
    # fresh clone's search (8+ 16+ 32- 24-) found 16 req/s where 9 kept 0.67.
    first = [
        d for d in decisions if figures[0]["start"] <= d.mono_s < figures[1]["start"]
    ]
    assert first, desired
    assert all(d.desired == 1 for d in first), desired
    assert added is not None, desired
    assert added > figures[1]["start"], desired
    # The second server was routed before the hold stage is judged (3.9 and 6.6 s
    # into the rise in two runs).
    assert added < figures[2]["start"], desired
