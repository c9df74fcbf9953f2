"""One process against a coordinator with N workers: the same seeded schedule, the
same simulator, side by side (issue #42's "the merged run's p99 send lag within
1 ms of one process's").

The target is ``servemon sim --profile tiny`` (its own process, started once). Each
round runs ``servemon ramp --stages RATE:SECS --repeats R --seed SEED`` twice, the
order alternating from round to round: once as one process (``single``), once as a
coordinator (``--fleet-listen 127.0.0.1:0 --fleet-workers N``) with N ``servemon
worker`` processes on loopback (``fleet``). Both send the one schedule the seed
draws (the fleet's test holds each send time to within 1 us), Poisson arrivals by
default. Per run, from ``requests.jsonl``: p50/p99 of the dispatch lag (actual
minus scheduled send), of TTFT and of E2E, and the client's CPU seconds (the
processes' user + system time from ``wait4``, their start included: the fleet's is
the coordinator's and its workers' together); then the median of the rounds per
mode. Last, per round,
``servemon compare SINGLE FLEET`` (the stage's repeats give the spread between
runs) and its verdicts on the TTFT, ITL and E2E figures.

With ``--pin`` the simulator runs on CPU 0 and every client process (the one
process, or the coordinator and its workers) on CPU 1: the target then has a core
of its own in both modes, as it has a machine of its own in a real fleet, and
the fleet's extra client processes cannot slow it.

    PYTHONPATH=$PWD:$PWD/benchmarks .venv/bin/python benchmarks/fleet_lag.py \\
        [--rate 100] [--secs 12] [--repeats 3] [--rounds 3] [--workers 4] [--pin]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import SERVEMON, sim_process

from servemon.loadgen.reports.compare import compare, verdict_text

TOKEN = "fleet-benchmark-token-0123456789"
COORDINATOR = re.compile(r"workers to join at (https?://\S+)")
FIGURES = ("dispatch_lag_s", "ttft_s", "e2e_s")
JUDGED = ("TTFT", "ITL", "E2E")


@dataclass(slots=True)
class Run:
    mode: str
    round: int
    path: Path
    records: int
    #: (figure, quantile) -> seconds
    values: dict[tuple[str, int], float]
    cpu_s: float


def percentile(values: list[float], q: int) -> float:
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def wait_cpu(proc: subprocess.Popen[str], timeout: float) -> tuple[int, float]:
    """Wait for ``proc``; its exit status and CPU seconds (user + system)."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_utime + usage.ru_stime
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{proc.args!r} did not end in {timeout} s")
        time.sleep(0.05)


def ramp(
    args: argparse.Namespace, target: str, out: Path, fleet: bool
) -> tuple[Path, float]:
    command = [
        str(SERVEMON),
        "ramp",
        "--target",
        target,
        "--stages",
        f"{args.rate:g}:{args.secs:g}",
        "--repeats",
        str(args.repeats),
        "--seed",
        str(args.seed),
        "--workload",
        args.workload,
        "--ignore-eos",
        "--energy",
        "off",
        "--metrics-port",
        "0",
        "--out",
        str(out),
    ]
    if args.pin:
        command = ["taskset", "-c", "1", *command]
    env = {**os.environ, "SERVEMON_FLEET_TOKEN": TOKEN}
    workers: list[subprocess.Popen[str]] = []
    if fleet:
        command += [
            "--fleet-listen",
            "127.0.0.1:0",
            "--fleet-workers",
            str(args.workers),
        ]
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    if fleet:
        assert proc.stdout is not None
        url = None
        for line in proc.stdout:
            found = COORDINATOR.search(line)
            if found:
                url = found.group(1)
                break
        if url is None:
            raise RuntimeError(f"no coordinator URL: {proc.stderr}")
        # The rest of its output is read, so that a full pipe never blocks it.
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        spool = out / "spool"
        spool.mkdir(parents=True)
        join = [str(SERVEMON), "worker", "--join", url, "--spool", str(spool)]
        if args.pin:
            join = ["taskset", "-c", "1", *join]
        workers = [
            subprocess.Popen(
                [*join, "--name", f"w{i}"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(args.workers)
        ]
    limit = args.secs * args.repeats + 120
    status, cpu = wait_cpu(proc, limit)
    if status != 0:
        assert proc.stderr is not None
        raise RuntimeError(f"ramp exited {status}: {proc.stderr.read()}")
    for worker in workers:
        status, worker_cpu = wait_cpu(worker, 30)
        if status != 0:
            assert worker.stderr is not None
            raise RuntimeError(f"worker exited {status}: {worker.stderr.read()}")
        cpu += worker_cpu
    (run_dir,) = (p for p in out.iterdir() if p.is_dir() and p.name != "spool")
    return run_dir, cpu


def measure(mode: str, n: int, path: Path, cpu_s: float) -> Run:
    records = read_jsonl(path / "requests.jsonl")
    ok = [r for r in records if r["outcome"] == "ok"]
    values = {}
    for figure in FIGURES:
        found = [float(r[figure]) for r in ok if r.get(figure) is not None]
        for q in (50, 99):
            values[(figure, q)] = percentile(found, q)
    if len(ok) != len(records):
        print(f"  {mode} round {n}: {len(records) - len(ok)} requests not ok")
    return Run(mode, n, path, len(records), values, cpu_s)


def row(run: Run) -> str:
    v = run.values
    ms = [f"{v[(f, q)] * 1e3:9.3f}" for f in FIGURES for q in (50, 99)]
    head = f"{run.mode:<7}{run.round:>6}{run.records:>9}"
    return f"{head}{''.join(ms)}{run.cpu_s:>9.1f}"


HEADER = (
    f"{'mode':<7}{'round':>6}{'requests':>9}"
    f"{'lag p50':>9}{'lag p99':>9}{'TTFT p50':>9}{'p99':>9}{'E2E p50':>9}{'p99':>9}"
    f"{'CPU s':>9}"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--secs", type=float, default=12.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--workload", default="random:prompt=16,output=16")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the simulator on CPU 0, every client process on CPU 1",
    )
    args = parser.parse_args()
    runs: list[Run] = []
    print(
        f"{args.rate:g} req/s Poisson, {args.secs:g} s x {args.repeats} repeats, "
        f"seed {args.seed}, {args.workload}; fleet: {args.workers} workers on loopback"
    )
    print("times in ms; CPU s: the client processes' user + system, start included")
    print(HEADER)
    if args.pin:
        print("pinned: the simulator on CPU 0, every client process on CPU 1")
    target = sim_process("--profile", "tiny", cpu=0 if args.pin else None)
    with tempfile.TemporaryDirectory() as tmp, target as url:
        root = Path(tmp)
        for n in range(1, args.rounds + 1):
            order = ("single", "fleet") if n % 2 else ("fleet", "single")
            for mode in order:
                out = root / f"{mode}-{n}"
                path, cpu = ramp(args, url, out, fleet=mode == "fleet")
                runs.append(measure(mode, n, path, cpu))
                print(row(runs[-1]), flush=True)
        print("\nmedians of the rounds")
        print(HEADER)
        medians = {}
        for mode in ("single", "fleet"):
            own = [r for r in runs if r.mode == mode]
            values = {
                key: statistics.median(r.values[key] for r in own)
                for key in own[0].values
            }
            cpu = statistics.median(r.cpu_s for r in own)
            medians[mode] = values
            print(row(Run(mode, 0, Path(), 1, values, cpu)))
        gap = medians["fleet"][("dispatch_lag_s", 99)]
        gap -= medians["single"][("dispatch_lag_s", 99)]
        print(f"p99 send lag, fleet minus single: {gap * 1e3:+.3f} ms (goal within 1)")
        print("\ncompare SINGLE FLEET, per round (the stage's repeats as the spread)")
        for n in range(1, args.rounds + 1):
            single = next(r.path for r in runs if r.mode == "single" and r.round == n)
            fleet = next(r.path for r in runs if r.mode == "fleet" and r.round == n)
            found = compare([single, fleet]).differences[0]
            shown = [
                f"{figure}: {verdict_text(d)}"
                for (_level, figure), d in found.items()
                if figure.startswith(JUDGED)
            ]
            print(f"round {n}: " + "; ".join(shown))


if __name__ == "__main__":
    main()
