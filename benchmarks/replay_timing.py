"""How close ``servemon replay`` sends each request to its trace's (scaled) time.

Two traces of at least ``--requests`` requests each are written: a synthetic
Mooncake-format one (``servemon trace synth``: diurnal rate, bursts, conversations
with shared system prompts) and a plain CSV one of lengths with bursty gaps (every
tenth gap 0, as requests that arrive together). Each is replayed with ``servemon
replay`` against ``servemon sim --profile tiny`` (pinned to CPU 0; the client to
CPU 1), as a user runs it (no real-time scheduling), and the achieved send times
are compared with the trace's: the schedule servemon followed must be the trace's
offsets scaled (checked to the microsecond), and the dispatch lag (actual minus
scheduled send, from ``requests.jsonl``) is printed as p50/p99/max.

Each trace is replayed as a user gets it by default, then with
``--cpu-dma-latency 0`` (idle CPUs kept polling, :mod:`loadgen.cpulatency`) where
this machine lets the device be written; ``--repeats`` runs each pair that many
times, alternating, and prints the median of each figure.

    .venv/bin/python benchmarks/replay_timing.py [--requests 10000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import tempfile
from pathlib import Path

from _common import SERVEMON, sim_process

from loadgen.cpulatency import PM_QOS_PATH
from loadgen.replayplan import replay_plan
from loadgen.tracefile import prefix_hit_ratio, read_trace
from loadgen.tracesynth import SynthSpec, synthesize


def synthetic(path: Path, requests: int) -> None:
    rate = 25.0  # conversations a second; with turns, about 2.5x as many requests
    duration = requests / (rate * 2.0)
    spec = SynthSpec(
        duration_s=duration,
        rate=rate,
        seed=11,
        diurnal=0.5,
        period_s=duration,
        bursts_per_hour=3600 / 60,
        burst_s=5,
        burst_x=2,
        input_median=48,
        output_median=8,
        sigma=0.5,
        system_prompts=4,
        system_tokens=512,
        turns=4,
        think_s=5,
    )
    lines = list(synthesize(spec))
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def plain(path: Path, requests: int) -> None:
    rng = random.Random(12)
    t = 0.0
    rows = ["timestamp,prompt_tokens,output_tokens"]
    for i in range(requests):
        t += 0.0 if i % 10 == 9 else rng.expovariate(60.0)
        rows.append(f"{t:.6f},{rng.randint(16, 256)},{rng.randint(2, 16)}")
    path.write_text("\n".join(rows) + "\n")


def replay(
    trace: Path, url: str, out: Path, rate_scale: float, extra: list[str]
) -> dict[str, float]:
    command = [
        "taskset", "-c", "1", str(SERVEMON), "replay", str(trace),
        "--target", url, "--rate-scale", f"{rate_scale:g}", "--metrics-port", "0",
        "--max-inflight", "100000", "--timeout", "60", "--out", str(out), *extra,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"servemon replay failed: {done.stderr[-2000:]}")
    (run,) = out.glob("*-replay")
    records = [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()]
    entries = read_trace(trace)
    plan = replay_plan(entries, rate_scale=rate_scale)
    scheduled = sorted(r["scheduled_s"] for r in records)
    offsets = [t - scheduled[0] for t in scheduled]
    wanted = [o for _, o in plan.sends]
    worst = max(abs(a - b) for a, b in zip(offsets, wanted, strict=True))
    lags = sorted(r["sent_s"] - r["scheduled_s"] for r in records)
    q = statistics.quantiles(lags, n=100, method="inclusive")
    errors = sum(r["outcome"] != "ok" for r in records)
    return {
        "requests": len(records),
        "errors": errors,
        "duration_s": plan.duration_s,
        "schedule_error_us": worst * 1e6,
        "lag_p50_ms": q[49] * 1000,
        "lag_p99_ms": q[98] * 1000,
        "lag_max_ms": lags[-1] * 1000,
        "early": sum(x < 0 for x in lags),
        "hit_ratio_trace": prefix_hit_ratio(entries) or 0.0,
    }


FIGURES = ("schedule_error_us", "lag_p50_ms", "lag_p99_ms", "lag_max_ms", "early")


def row(name: str, r: dict[str, float]) -> str:
    return (
        f"{name:<46} {r['requests']:>8.0f} {r['errors']:>6.0f} "
        f"{r['duration_s']:>7.0f} {r['schedule_error_us']:>12.2f} "
        f"{r['lag_p50_ms']:>7.2f} {r['lag_p99_ms']:>7.2f} "
        f"{r['lag_max_ms']:>7.2f} {r['early']:>5.0f} "
        f"{r['hit_ratio_trace']:>9.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--rate-scale", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--replay-arg",
        action="append",
        default=[],
        help="a flag for servemon replay (repeatable), e.g. --replay-arg=--no-stream",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="replay-timing-"))
    traces = {"synthetic (Mooncake JSONL)": work / "synth.jsonl"}
    synthetic(traces["synthetic (Mooncake JSONL)"], args.requests)
    traces["plain CSV, bursty"] = work / "plain.csv"
    plain(traces["plain CSV, bursty"], args.requests)
    conditions = {"default": list(args.replay_arg)}
    if PM_QOS_PATH.exists() and os.access(PM_QOS_PATH, os.W_OK):
        conditions["--cpu-dma-latency 0"] = [*args.replay_arg, "--cpu-dma-latency=0"]
    print(
        f"replay_timing: servemon replay against servemon sim --profile tiny; sim "
        f"on CPU 0, client on CPU 1; no real-time scheduling; rate scale "
        f"{args.rate_scale:g}; replay flags {' '.join(args.replay_arg) or 'none'}; "
        f"{args.repeats} run(s) of each; dispatch lag in ms"
    )
    print(
        f"{'trace, condition':<46} {'requests':>8} {'errors':>6} {'seconds':>7} "
        f"{'sched err us':>12} {'lag p50':>7} {'lag p99':>7} {'lag max':>7} "
        f"{'early':>5} {'hit ratio':>9}"
    )
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    with sim_process("--profile", "tiny", cpu=0) as url:
        for repeat in range(args.repeats):
            for name, trace in traces.items():
                for condition, extra in conditions.items():
                    out = work / f"{trace.stem}-{repeat}-{len(results)}"
                    r = replay(trace, url, out, args.rate_scale, extra)
                    results.setdefault((name, condition), []).append(r)
                    print(row(f"{name}, {condition}", r), flush=True)
                    subprocess.run(["rm", "-rf", str(out)], check=False)
    if args.repeats > 1:
        print(f"medians of {args.repeats}:")
        for (name, condition), runs in results.items():
            median = dict(runs[0])
            for key in FIGURES:
                median[key] = statistics.median(r[key] for r in runs)
            print(row(f"{name}, {condition}", median))
    subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    main()
