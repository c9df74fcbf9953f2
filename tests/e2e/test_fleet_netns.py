"""One run from many load machines, each machine a network namespace of its own.

The machines (:mod:`tests.support.netns`: a bridge in the root namespace, a veth
pair to each namespace, addresses in 10.231.S.0/24):

- **fleet**: two ``servemon sim`` (tiny profile, ``--speed 0.05``, a batch of 2: some
  13 requests/s each) on its loopback, Debian's nginx in front of them on the
  bridge (weighted least_conn, as in ``test_fleet.py``), ``servemon exporter``
  scraping the two, and Debian's Prometheus on the bridge scraping the exporter and
  the coordinator's client ``/metrics`` across the bridge every second;
- **coord**: the coordinator (the load command with ``--fleet-listen``, its client
  ``/metrics`` on its bridge address);
- **w0-w3**: one ``servemon worker`` each, with its wall clock set off by
  libfaketime by +0.5, -0.25, +1.0 and -1.0 s (its monotonic clock is the host's).

Against nginx, a 4-worker ``ramp``, ``capacity`` search and ``control
--prometheus``, each one run directory. Each run: every worker measured within
1 ms of the offset it was given and known by its own namespace's address, every
worker sent a share, and ``servemon report`` reads the directory; then
``servemon compare`` reads the three.

The ramp's coordinator listens on 0.0.0.0, as the docs show: it prints its bind
address, and the workers join by the coordinator's address on the bridge.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.alerting import prometheus_argv, prometheus_file
from tests.support.fleet import COORDINATOR, clock_env, sent_one_schedule
from tests.support.margins import Margin
from tests.support.netns import Namespace, Network, Process, network
from tests.support.nginx import NGINX, nginx_file
from tests.support.processes import SERVEMON, servemon_argv
from tests.support.rundirs import poll, read_json, read_jsonl

PROMETHEUS = shutil.which("prometheus")

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        PROMETHEUS is None or NGINX is None,
        reason="needs Debian's prometheus and nginx (scripts/system-deps)",
    ),
    pytest.mark.skipif(
        not clock_env(0.0), reason="needs libfaketime (Debian's faketime)"
    ),
]

TOKEN = "fleet-token-of-the-netns-tests-0123"
ENV = {"SERVEMON_FLEET_TOKEN": TOKEN}
#: Clock offsets the workers are given (s): up to a second either way.
OFFSETS = (0.5, -0.25, 1.0, -1.0)
SIM_PORTS = {"sim-a": 8001, "sim-b": 8002}
SLOTS = 2
NGINX_PORT, EXPORTER_PORT, PROMETHEUS_PORT, CLIENT_PORT = 8000, 9400, 9090, 9401
WORKLOAD = ("--workload", "random:prompt=16,output=8", "--ignore-eos")
#: Far above a request's time (about 150 ms): the runs are not about the SLO.
LOOSE_SLO = "ttft_p95<=2"


@dataclass
class Stack:
    """The machines and what serves on them."""

    net: Network
    fleet: Namespace
    coord: Namespace
    workers: list[Namespace]
    serving: list[Process]
    folder: Path
    runs: dict[str, Path] = field(default_factory=dict)

    @property
    def target(self) -> str:
        return f"http://{self.fleet.address}:{NGINX_PORT}"

    @property
    def prometheus(self) -> str:
        return f"http://{self.fleet.address}:{PROMETHEUS_PORT}"

    def alive(self) -> None:
        for process in self.serving:
            process.alive()


#: No proxy from the environment: every address here is a namespace's.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(url: str) -> tuple[int, bytes]:
    with OPENER.open(url, timeout=5) as resp:
        return resp.status, resp.read()


def query(prometheus: str, promql: str) -> list[dict[str, Any]]:
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    body = json.loads(get(url)[1])
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    assert NGINX is not None
    assert PROMETHEUS is not None
    folder = tmp_path_factory.mktemp("netns")
    with network(folder) as net:
        fleet = net.add("fleet")
        coord = net.add("coord")
        workers = [net.add(f"w{i}") for i in range(len(OFFSETS))]
        serving = [
            fleet.start(
                name,
                servemon_argv(
                    "sim",
                    *("--host", "127.0.0.1", "--port", str(port)),
                    *("--profile", "tiny", "--speed", "0.05"),
                    *("--max-num-seqs", str(SLOTS)),
                ),
            )
            for name, port in SIM_PORTS.items()
        ]
        serving.append(
            fleet.start(
                "exporter",
                servemon_argv(
                    "exporter",
                    *(
                        arg
                        for name, port in SIM_PORTS.items()
                        for arg in ("--target", f"{name}=http://127.0.0.1:{port}")
                    ),
                    *("--listen", f"127.0.0.1:{EXPORTER_PORT}", "--no-gpu"),
                ),
            )
        )
        nginx_dir = folder / "nginx"
        nginx_dir.mkdir()
        conf = nginx_file(
            nginx_dir,
            f"{fleet.address}:{NGINX_PORT}",
            [(f"127.0.0.1:{port}", SLOTS) for port in SIM_PORTS.values()],
        )
        serving.append(
            fleet.start("nginx", [NGINX, "-p", str(nginx_dir), "-c", str(conf)])
        )
        config = prometheus_file(
            folder / "prometheus.yml",
            jobs={
                "servemon-exporter": [f"127.0.0.1:{EXPORTER_PORT}"],
                "servemon-loadgen": [f"{coord.address}:{CLIENT_PORT}"],
            },
        )
        serving.append(
            fleet.start(
                "prometheus",
                prometheus_argv(
                    PROMETHEUS, config, folder, PROMETHEUS_PORT, host=fleet.address
                ),
            )
        )
        made = Stack(net, fleet, coord, workers, serving, folder)

        def balancing() -> bool:
            made.alive()
            return get(f"{made.target}/v1/models")[0] == 200

        def scraped() -> bool:
            made.alive()
            found = query(made.prometheus, "servemon_engine_requests_running")
            return {s["metric"].get("target") for s in found} == set(SIM_PORTS)

        poll(balancing, 60, "nginx in the fleet's namespace proxies /v1/models")
        poll(scraped, 60, "both simulators' series in Prometheus")
        yield made


def fleet_run(
    stack: Stack,
    margin: Margin,
    name: str,
    command: str,
    *args: str,
    listen: str,
    timeout_s: float,
) -> Path:
    """Run ``servemon COMMAND`` against nginx from the coordinator's namespace,
    with a worker in each worker namespace; its run directory, checked as a fleet's
    (each clock within 1 ms, each worker known by its address, each one's share)
    and read by ``servemon report``."""
    out = stack.folder / "runs" / name
    coordinator = stack.coord.start(
        f"{name}-coordinator",
        [
            *SERVEMON,
            command,
            *("--target", stack.target, "--target-name", name),
            *args,
            *WORKLOAD,
            *("--metrics-host", stack.coord.address),
            *("--metrics-port", str(CLIENT_PORT)),
            *("--fleet-listen", listen, "--fleet-workers", str(len(stack.workers))),
            *("--timeout", "30", "--out", str(out)),
        ],
        env=ENV,
    )

    def printed() -> str | None:
        coordinator.alive()
        found = COORDINATOR.search(coordinator.stdout)
        return found.group(1) if found else None

    url = urllib.parse.urlsplit(poll(printed, 60, "the coordinator's URL"))
    # The coordinator prints the address it is bound to; from another machine it
    # is reached by its own address (the same where it binds one).
    join = f"{url.scheme}://{stack.coord.address}:{url.port}"
    started = time.monotonic()
    workers = [
        ns.start(
            f"{name}-w{i}",
            [*SERVEMON, "worker", "--join", join, "--name", f"w{i}"],
            env=ENV,
            preload=clock_env(offset),
        )
        for i, (ns, offset) in enumerate(zip(stack.workers, OFFSETS, strict=True))
    ]
    status = coordinator.wait(timeout_s)
    took = time.monotonic() - started
    assert status == 0, coordinator.tail()
    for worker in workers:
        assert worker.wait(20) == 0, worker.tail()
    (run,) = out.iterdir()
    info = read_json(run / "run.json")
    by_name = {w["name"]: w for w in info["fleet"]["workers"]}
    assert sorted(by_name) == [f"w{i}" for i in range(len(OFFSETS))]
    records = read_jsonl(run / "requests.jsonl")
    shares = Counter(r["worker"] for r in records)
    measured = []
    for i, (ns, offset) in enumerate(zip(stack.workers, OFFSETS, strict=True)):
        worker = by_name[f"w{i}"]
        measured.append(f"w{i} {1e3 * (worker['offset_s'] - offset):+.3f} ms")
        # Each worker's clock, measured across the bridge: within 1 ms of the
        # offset it was given.
        error = worker["offset_s"] - offset
        margin("clock offset error s", error, low=-1e-3, high=1e-3, why=worker)
        margin("clock uncertainty s", worker["uncertainty_s"], below=1e-3, why=worker)
        # It joined from its own machine, and sent a share.
        assert worker["address"] == ns.address, worker
        assert worker["stop_reason"] == "run ended", worker
        assert worker["records"] == worker["credits"] > 0, worker
        assert shares[worker["index"]] == worker["records"], (shares, worker)
    assert sum(shares.values()) == len(records)
    # Requests go round the workers in turn.
    assert max(shares.values()) - min(shares.values()) <= 1, shares
    sys.stderr.write(
        f"{name}: {took:.1f} s from the workers' start; {len(records)} requests, "
        f"shares {dict(sorted(shares.items()))}; offsets off by {', '.join(measured)}"
        f"; rtt {max(w['rtt_s'] for w in by_name.values()) * 1e3:.3f} ms at most\n"
    )
    (run / "report.html").unlink(missing_ok=True)
    report = stack.coord.start(f"{name}-report", [*SERVEMON, "report", str(run)])
    assert report.wait(60) == 0, report.tail()
    assert (run / "report.html").stat().st_size > 0
    stack.runs[name] = run
    return run


STAGES, SEED = ((8.0, 2.0), (16.0, 2.0)), 23


@pytest.mark.timeout(180)
def test_a_ramp_from_four_machines(stack: Stack, margin: Margin) -> None:
    run = fleet_run(
        stack,
        margin,
        "ramp",
        "ramp",
        *("--stages", ",".join(f"{rate:g}:{secs:g}" for rate, secs in STAGES)),
        *("--seed", str(SEED), "--rps-max", "20"),
        listen="0.0.0.0:0",
        timeout_s=90,
    )
    # Together the four machines sent the one seeded schedule.
    sent_one_schedule(run, STAGES, SEED)


@pytest.mark.timeout(180)
def test_a_capacity_search_from_four_machines(stack: Stack, margin: Margin) -> None:
    run = fleet_run(
        stack,
        margin,
        "capacity",
        "capacity",
        *("--slo", LOOSE_SLO, "--arrival", "constant"),
        *("--rps-min", "4", "--rps-max", "16", "--precision", "0.5"),
        *("--step-seconds", "2", "--settle", "0.5", "--max-duration", "30"),
        *("--prometheus", stack.prometheus, "--scrape-interval", "1"),
        listen=f"{stack.coord.address}:0",
        timeout_s=90,
    )
    found = read_json(run / "summary.json")["capacity"]
    steps = [(s["rate"], s["good"]) for s in found["steps"]]
    samples = read_jsonl(run / "server_metrics.jsonl")
    fresh = sum((ln.get("signals") or {}).get("waiting") is not None for ln in samples)
    sys.stderr.write(
        f"capacity: {found['capacity_rps']} req/s, steps {steps}; "
        f"{fresh} of {len(samples)} Prometheus reads with the queue\n"
    )
    # Under the loose SLO every step is good up to the bound: 4, 8, 16 req/s.
    assert steps == [(4, True), (8, True), (16, True)], found
    assert found["capacity_rps"] == 16, found


@pytest.mark.timeout(180)
def test_control_through_prometheus_from_four_machines(
    stack: Stack, margin: Margin
) -> None:
    run = fleet_run(
        stack,
        margin,
        "control",
        "control",
        *("--hold", "waiting=4", "--duration", "16", "--slo", LOOSE_SLO),
        *("--rps-start", "10", "--rps-min", "2", "--rps-max", "60"),
        *("--prometheus", stack.prometheus, "--scrape-interval", "1"),
        listen=f"{stack.coord.address}:0",
        timeout_s=90,
    )
    held = read_json(run / "summary.json")["control"]
    ticks = read_jsonl(run / "control.jsonl")
    seen = [t["measured"] for t in ticks]
    sys.stderr.write(
        f"control: {len(ticks)} ticks, measured {seen}, offered "
        f"{[round(t['offered_rps'], 1) for t in ticks]}\n"
    )
    # The fleet's queue came from Prometheus (in the fleet's namespace), read in
    # most ticks.
    assert held["signal"] == "waiting", held
    assert held["source"] == "prometheus", held
    read = sum(m is not None for m in seen) / len(ticks)
    margin("ticks with the queue", read, low=0.75, why=ticks)
    # ... and Prometheus scraped the coordinator's client /metrics across the
    # bridge: the run's requests, counted there.
    counted = query(
        stack.prometheus,
        'sum(last_over_time(servemon_client_requests_total{target="control"}[5m]))',
    )
    records = read_jsonl(run / "requests.jsonl")
    assert counted, "no client series of the control run in Prometheus"
    sys.stderr.write(
        f"control: Prometheus counted {counted[0]['value'][1]} of "
        f"{len(records)} requests\n"
    )
    share = float(counted[0]["value"][1]) / len(records)
    margin("requests Prometheus counted", share, low=0.5, why=counted)


def compare(stack: Stack, name: str, *runs: Path) -> Process:
    """Start ``servemon compare RUNS``, its HTML to ``NAME.html``."""
    out = stack.folder / f"{name}.html"
    return stack.coord.start(
        name, [*SERVEMON, "compare", *map(str, runs), "--out", str(out)]
    )


def finished(stack: Stack, process: Process) -> str:
    """What a compare printed, once it ended with status 0 and wrote its HTML."""
    assert process.wait(60) == 0, process.tail()
    assert (stack.folder / f"{process.name}.html").stat().st_size > 0
    return process.stdout


@pytest.mark.timeout(120)
def test_compare_reads_the_fleets_runs(stack: Stack) -> None:
    if len(stack.runs) < 3:
        pytest.skip("needs the ramp, capacity and control runs of this module")
    # The ramp and the search both sent 8 and 16 req/s: compare lines them up. A
    # control run has one level, its mean rate, which no other run shares:
    # compare reads it against itself. The two at once.
    both = [
        compare(stack, "compare-ramp", stack.runs["ramp"], stack.runs["capacity"]),
        compare(stack, "compare-control", stack.runs["control"], stack.runs["control"]),
    ]
    text, _ = (finished(stack, process) for process in both)
    levels = set(re.findall(r"^\S*\s*(\d+) rps", text, re.M))
    assert {"8", "16"} <= levels, text
