"""How close ``servemon replay`` sends each request to its trace's (scaled) time.

Two traces of at least ``--requests`` requests each are written: a synthetic
Mooncake-format one (``servemon trace synth``: diurnal rate, bursts, conversations
with shared system prompts) and a plain CSV one of lengths with bursty gaps (every
tenth gap 0, as requests that arrive together); with ``--traces long``, a CSV of
production's long prompts (lognormal around 10,000 tokens, one in 250 of 150,000,
the same bursts) against a simulator whose context takes them. Each is replayed with
``servemon replay`` against ``servemon sim --profile tiny`` (pinned to CPU 0; the
client to CPU 1), as a user runs it (no real-time scheduling), and the achieved send
times are compared with the trace's: the schedule servemon followed must be the
trace's offsets scaled (checked to the microsecond), and the dispatch lag (actual
minus scheduled send, from ``requests.jsonl``) is printed as p50/p99/max.

Each trace is replayed as a user gets it by default, then with
``--cpu-dma-latency 0`` (idle CPUs kept polling,
:mod:`servemon.loadgen.send.cpulatency`) where this machine lets the device be written;
``--repeats`` runs each pair that many times, alternating, and prints the median of each
figure. ``steal %`` is the share of the client CPU's time the hypervisor ran something
else while the replay ran (``/proc/stat``), the one cause of lateness a guest can see
but not change.

With ``--peer vllm`` each trace is also replayed by ``vllm bench serve
--dataset-name timed_trace`` (0.33, self-timed from the trace's timestamps; the plain
CSV as its JSONL twin), pinned and aimed the same way, run by turns with servemon in
each repeat. vLLM saves no send lag; its schedule is the trace's timestamps from a
``time.time()`` it does not save, so both tools' lags are also given by one rule
(``same rule``): each request's send minus its trace offset, less the smallest of
these, i.e. the least-late request at lag 0 (a lower bound; see ``_vllm_peer.py``).

    .venv/bin/python benchmarks/replay_timing.py [--requests 10000] [--repeats 3]
        [--peer vllm [--peer-venv .venv-vllm]] [--default-only]
        [--traces synthetic,plain,long]

Each client's peak RSS is measured with GNU ``time``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import _vllm_peer
from _common import SERVEMON, sim_process

from servemon.loadgen.send.cpulatency import PM_QOS_PATH
from servemon.loadgen.workloads.replayplan import replay_plan
from servemon.loadgen.workloads.tracefile import prefix_hit_ratio, read_trace
from servemon.loadgen.workloads.tracesynth import SynthSpec, synthesize

#: The long trace's longest prompt, and the simulator's context for it.
LONG_MAX_TOKENS = 200_000
LONG_SIM = ("--max-model-len", "262144", "--num-gpu-blocks", "1000000", "--speed", "20")


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


def long_context(path: Path, requests: int) -> None:
    """Production's long prompts: lognormal around 10,000 tokens (mean about
    12,000), one in 250 of 150,000 tokens, short answers, some 8 requests a second with
    every tenth gap 0 (requests that arrive in the same millisecond)."""
    rng = random.Random(13)
    t = 0.0
    rows = ["timestamp,prompt_tokens,output_tokens"]
    for i in range(requests):
        t += 0.0 if i % 10 == 9 else rng.expovariate(8.0)
        prompt = min(LONG_MAX_TOKENS, max(1000, round(rng.lognormvariate(9.21, 0.6))))
        if i % 250 == 125:
            prompt = 150_000  # past the 131,071 tokens of a 17-bit token count
        rows.append(f"{t:.6f},{prompt},{rng.randint(8, 32)}")
    path.write_text("\n".join(rows) + "\n")


def peer_twin(trace: Path, out: Path) -> Path:
    """The trace as ``vllm bench serve``'s ``timed_trace`` reads it (JSONL, ms
    timestamps, 512-token hash blocks): the Mooncake file itself, or the plain
    CSV's rows with a block id of their own for each 512 tokens (no sharing)."""
    if trace.suffix == ".jsonl":
        return trace
    lines = []
    block = 0
    for entry in read_trace(trace):
        assert entry.prompt_tokens is not None
        assert entry.output_tokens is not None
        blocks = max(1, -(-entry.prompt_tokens // 512))
        lines.append(
            json.dumps(
                {
                    "timestamp": entry.at_s * 1000.0,
                    "input_length": entry.prompt_tokens,
                    "output_length": entry.output_tokens,
                    "hash_ids": list(range(block, block + blocks)),
                }
            )
        )
        block += blocks
    out.write_text("\n".join(lines) + "\n")
    return out


def same_rule(sent: list[float], offsets: list[float]) -> list[float]:
    """Send minus trace offset, the least-late request at 0 (the peer's rule)."""
    raw = [a - b for a, b in zip(sent, offsets, strict=True)]
    zero = min(raw)
    return sorted(x - zero for x in raw)


def replay_peer(
    trace: Path, url: str, out: Path, venv: Path, tokenizer: Path, model: str
) -> dict[str, float]:
    entries = read_trace(trace)
    twin = peer_twin(trace, out.parent / f"{trace.stem}-peer.jsonl")
    out.mkdir(parents=True, exist_ok=True)
    command = [
        "taskset", "-c", "1", *_vllm_peer.bench_serve(venv),
        "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
        "--model", model, "--tokenizer", str(tokenizer),
        "--dataset-name", "timed_trace", "--dataset-path", str(twin),
        "--timed-trace-sec-multiplier", "0.001",
        "--timed-trace-chunk-hash-size", "512",
        "--num-prompts", str(len(entries)), "--seed", "0", "--disable-tqdm",
        "--save-result", "--save-detailed", "--result-dir", str(out),
        "--result-filename", "result.json",
    ]  # fmt: skip
    steal_pct, rss_mb = run_client(command, "vllm bench serve")
    data: dict[str, Any] = json.loads((out / "result.json").read_text())
    starts: list[float] = data["start_times"]
    offsets = [e.at_s for e in entries]
    lags = same_rule(starts, offsets)
    q = statistics.quantiles(lags, n=100, method="inclusive")
    errors = sum(bool(e) for e in data["errors"])
    return {
        "requests": len(starts),
        "errors": errors,
        "duration_s": offsets[-1],
        "schedule_error_us": float("nan"),
        "lag_p50_ms": float("nan"),
        "lag_p99_ms": float("nan"),
        "lag_max_ms": float("nan"),
        "early": float("nan"),
        "over_1ms": sum(x > 0.001 for x in lags),
        "steal_pct": steal_pct,
        "same_p50_ms": q[49] * 1000,
        "same_p99_ms": q[98] * 1000,
        "hit_ratio_trace": prefix_hit_ratio(entries) or 0.0,
        "rss_mb": rss_mb,
        "mean_prompt": statistics.fmean(e.prompt_tokens or 0 for e in entries),
    }


def cpu_steal(cpu: int) -> tuple[int, int]:
    """(steal, total) jiffies of one CPU from ``/proc/stat``; (0, 0) where absent."""
    try:
        text = Path("/proc/stat").read_text()
    except OSError:
        return 0, 0
    for line in text.splitlines():
        name, *fields = line.split()
        if name == f"cpu{cpu}":
            ticks = [int(x) for x in fields]
            steal = ticks[7] if len(ticks) > 7 else 0
            return steal, sum(ticks[:8])
    return 0, 0


def run_client(command: list[str], name: str) -> tuple[float, float]:
    """Run a client (``taskset -c 1 ...``) to its end: CPU 1's steal time
    meanwhile, in % of its time, and the client's peak RSS in MiB (GNU time)."""
    steal0, total0 = cpu_steal(1)
    timed = [*command[:3], "/usr/bin/time", "-f", "maxrss_kb=%M", *command[3:]]
    done = subprocess.run(timed, capture_output=True, text=True, check=False)
    steal1, total1 = cpu_steal(1)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed: {done.stderr[-2000:]}")
    found = re.findall(r"maxrss_kb=(\d+)", done.stderr)
    rss_mb = int(found[-1]) / 1024 if found else float("nan")
    return 100.0 * (steal1 - steal0) / max(1, total1 - total0), rss_mb


def replay(
    trace: Path, url: str, out: Path, rate_scale: float, extra: list[str]
) -> dict[str, float]:
    command = [
        "taskset", "-c", "1", str(SERVEMON), "replay", str(trace),
        "--target", url, "--rate-scale", f"{rate_scale:g}", "--metrics-port", "0",
        "--max-inflight", "100000", "--timeout", "60", "--out", str(out), *extra,
    ]  # fmt: skip
    steal_pct, rss_mb = run_client(command, "servemon replay")
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
    by_send = sorted(records, key=lambda r: r["scheduled_s"])
    same = same_rule([r["sent_s"] for r in by_send], wanted)
    qs = statistics.quantiles(same, n=100, method="inclusive")
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
        "over_1ms": sum(x > 0.001 for x in lags),
        "steal_pct": steal_pct,
        "same_p50_ms": qs[49] * 1000,
        "same_p99_ms": qs[98] * 1000,
        "hit_ratio_trace": prefix_hit_ratio(entries) or 0.0,
        "rss_mb": rss_mb,
        "mean_prompt": statistics.fmean(e.prompt_tokens or 0 for e in entries),
    }


FIGURES = (
    "schedule_error_us",
    "lag_p50_ms",
    "lag_p99_ms",
    "lag_max_ms",
    "early",
    "over_1ms",
    "steal_pct",
    "same_p50_ms",
    "same_p99_ms",
    "rss_mb",
)


def row(name: str, r: dict[str, float]) -> str:
    return (
        f"{name:<46} {r['requests']:>8.0f} {r['errors']:>6.0f} "
        f"{r['duration_s']:>7.0f} {r['schedule_error_us']:>12.2f} "
        f"{r['lag_p50_ms']:>7.2f} {r['lag_p99_ms']:>7.2f} "
        f"{r['lag_max_ms']:>7.2f} {r['early']:>5.0f} {r['over_1ms']:>6.0f} "
        f"{r['steal_pct']:>7.2f} {r['same_p50_ms']:>8.2f} {r['same_p99_ms']:>8.2f} "
        f"{r['hit_ratio_trace']:>9.3f} {r['mean_prompt']:>7.0f} {r['rss_mb']:>7.0f}"
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
    parser.add_argument(
        "--peer",
        action="append",
        default=[],
        choices=["vllm"],
        help="also replay each trace with this peer (vllm: vllm bench serve 0.33 "
        "from .venv-peer-vllm, created on first use)",
    )
    parser.add_argument(
        "--peer-venv",
        type=Path,
        default=None,
        help="the peer's venv (.venv-vllm: the CPU build's own vllm bench serve)",
    )
    parser.add_argument(
        "--traces",
        default="synthetic,plain",
        help="which traces to replay: synthetic (Mooncake JSONL), plain (CSV), "
        "long (CSV of long prompts, against a simulator whose context takes them)",
    )
    parser.add_argument(
        "--default-only",
        action="store_true",
        help="replay as a user gets it by default only (no --cpu-dma-latency run)",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="replay-timing-"))
    wanted = args.traces.split(",")
    traces: dict[str, Path] = {}
    if "synthetic" in wanted:
        traces["synthetic (Mooncake JSONL)"] = work / "synth.jsonl"
        synthetic(traces["synthetic (Mooncake JSONL)"], args.requests)
    if "plain" in wanted:
        traces["plain CSV, bursty"] = work / "plain.csv"
        plain(traces["plain CSV, bursty"], args.requests)
    if "long" in wanted:
        traces["long context, bursty"] = work / "long.csv"
        long_context(traces["long context, bursty"], args.requests)
    if not traces:
        raise SystemExit("--traces: synthetic, plain, long or a list of them")
    conditions = {"default": list(args.replay_arg)}
    writable = PM_QOS_PATH.exists() and os.access(PM_QOS_PATH, os.W_OK)
    if writable and not args.default_only:
        conditions["--cpu-dma-latency 0"] = [*args.replay_arg, "--cpu-dma-latency=0"]
    peer_venv = tokenizer = None
    if args.peer and args.rate_scale != 1:
        raise SystemExit("--peer replays at the trace's own times: no --rate-scale")
    if "vllm" in args.peer:
        peer_venv = args.peer_venv or _vllm_peer.VENV
        _vllm_peer.ensure(peer_venv)
        tokenizer = _vllm_peer.make_tokenizer(work / "tokenizer", peer_venv)
        print(f"peer: vllm bench serve {_vllm_peer.version(peer_venv)} ({peer_venv})")
    print(
        f"replay_timing: servemon replay against servemon sim --profile tiny; sim "
        f"on CPU 0, client on CPU 1; no real-time scheduling; rate scale "
        f"{args.rate_scale:g}; replay flags {' '.join(args.replay_arg) or 'none'}; "
        f"{args.repeats} run(s) of each; dispatch lag in ms"
    )
    print(
        f"{'trace, condition':<46} {'requests':>8} {'errors':>6} {'seconds':>7} "
        f"{'sched err us':>12} {'lag p50':>7} {'lag p99':>7} {'lag max':>7} "
        f"{'early':>5} {'>1 ms':>6} {'steal %':>7} {'same p50':>8} {'same p99':>8} "
        f"{'hit ratio':>9} {'prompt':>7} {'RSS MiB':>7}"
    )
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    with contextlib.ExitStack() as sims:
        short_url = long_url = ""
        if any(t.stem != "long" for t in traces.values()):
            short_url = sims.enter_context(sim_process("--profile", "tiny", cpu=0))
        if any(t.stem == "long" for t in traces.values()):
            long_url = sims.enter_context(
                sim_process("--profile", "tiny", *LONG_SIM, cpu=0)
            )
        for repeat in range(args.repeats):
            for name, trace in traces.items():
                url = long_url if trace.stem == "long" else short_url
                for condition, extra in conditions.items():
                    out = work / f"{trace.stem}-{repeat}-{len(results)}"
                    r = replay(trace, url, out, args.rate_scale, extra)
                    results.setdefault((name, condition), []).append(r)
                    print(row(f"{name}, {condition}", r), flush=True)
                    subprocess.run(["rm", "-rf", str(out)], check=False)
                if peer_venv is not None and tokenizer is not None:
                    out = work / f"{trace.stem}-{repeat}-peer"
                    r = replay_peer(trace, url, out, peer_venv, tokenizer, "sim-tiny")
                    results.setdefault((name, "vllm bench serve"), []).append(r)
                    print(row(f"{name}, vllm bench serve", r), flush=True)
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
