"""servemon and ``vllm bench serve`` on the same real vLLM, and what watching costs.

One vLLM CPU server, started as the test suite starts it (``vllm_calibration``'s
:func:`vllm_process`: the tiny random-weight model, 64 KV blocks of 128 tokens,
``--max-num-seqs 16``), and two parts, one after the other:

1. **The peer, side by side.** The course's shape (128 prompt tokens, 128 output
   tokens, ``ignore_eos``, chat completions, Poisson arrivals) at each
   ``--rates`` level for ``--seconds``: ``servemon ramp`` (one stage) and ``vllm
   bench serve`` from the same CPU build (``.venv-vllm``, whose ``vllm`` console
   script dies on its own package name, so its ``serve`` module is run directly),
   alternating which goes first, ``--repeats`` times. Per run: TTFT p50/p99, TPOT
   mean, output tokens/s, and each client's send lag against its own schedule
   (the peer's rebuilt from its seed, :mod:`_vllm_peer`, a lower bound). Medians
   of the repeats, and servemon/peer ratios.
2. **Closed loop, side by side.** At each ``--concurrency`` level, ``--number``
   requests of the same shape with that many in flight: ``servemon sweep
   --parallel C`` and ``vllm bench serve --max-concurrency C --request-rate inf``,
   alternating, ``--repeats`` times: TTFT p50/p99, TPOT mean, output tokens/s.
3. **The cost of watching.** The same servemon load at the highest level, with and
   without ``servemon exporter`` beside it (scraped every second by this script,
   as a Prometheus at a 1 s interval would, with its canary probe every
   ``--probe-interval`` seconds), alternating, ``--repeats`` times each: TTFT
   p50/p99 and output tokens/s, medians with their spread (min-max).

    .venv/bin/python benchmarks/vllm_peers.py [--rates 4 12] [--seconds 20]
        [--concurrency 1 4 16] [--number 96] [--repeats 3] [--json out.json]

Needs ``scripts/vllm`` (``.venv-vllm``). Runs on the machine's cores as they are:
client, API server and engine share them, as on a user's 2-core box.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _vllm_peer as peer
from _common import SERVEMON
from vllm_calibration import MODEL, VLLM_PYTHON, servemon, vllm_process, wait_idle

PROMPT, OUTPUT = 128, 128
WORKLOAD = f"random:prompt={PROMPT},output={OUTPUT}"


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def med(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def spread(values: list[float | None], scale: float = 1000.0) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    return (
        f"{statistics.median(got) * scale:.1f} "
        f"({min(got) * scale:.1f}-{max(got) * scale:.1f})"
    )


def ours(
    url: str, tokenizer: str, out: Path, rate: float, seconds: float, seed: int
) -> dict[str, Any]:
    """One ``servemon ramp`` stage; its figures in seconds."""
    run = servemon(
        url,
        tokenizer,
        out,
        "ramp",
        *("--workload", WORKLOAD, "--stages", f"{rate:g}:{seconds:g}"),
        *("--arrival", "poisson", "--seed", str(seed)),
    )
    o = run.summary["overall"]
    return {
        **figures(o),
        "lag_p50": o["dispatch_lag"]["p50"],
        "lag_p99": o["dispatch_lag"]["p99"],
    }


def figures(overall: dict[str, Any]) -> dict[str, Any]:
    """What both loops compare, from a servemon summary's ``overall``."""
    return {
        "ok": overall["outcomes"].get("ok", 0),
        "requests": overall["requests"],
        "ttft_p50": overall["ttft"]["p50"],
        "ttft_p99": overall["ttft"]["p99"],
        "tpot_mean": overall["tpot"]["mean"],
        "out_tok_s": overall["output_throughput"],
    }


def ours_closed(
    url: str, tokenizer: str, out: Path, level: int, number: int
) -> dict[str, Any]:
    """One ``servemon sweep`` level; its figures in seconds."""
    run = servemon(
        url,
        tokenizer,
        out,
        "sweep",
        *("--workload", WORKLOAD, "--parallel", str(level)),
        *("--number", str(number), "--warmup", "0"),
    )
    return figures(run.summary["overall"])


def theirs_closed(
    url: str, tokenizer_dir: Path, out: Path, level: int, number: int, seed: int
) -> dict[str, Any]:
    """``vllm bench serve --max-concurrency`` of the same shape; seconds."""
    return run_peer(
        url,
        tokenizer_dir,
        out / f"peer-c{level}-{seed}",
        rate=math.inf,
        count=number,
        seed=seed,
        extra=("--max-concurrency", str(level)),
    )


def theirs(
    url: str, tokenizer_dir: Path, out: Path, rate: float, seconds: float, seed: int
) -> dict[str, Any]:
    """One ``vllm bench serve`` run of the same shape; its figures in seconds."""
    result_dir = out / f"peer-{rate:g}-{seed}"
    fig = run_peer(
        url,
        tokenizer_dir,
        result_dir,
        rate=rate,
        count=round(rate * seconds),
        seed=seed,
    )
    lags = sorted(
        r["sent_s"] - r["scheduled_s"]
        for r in peer.records(result_dir / "result.json", rate, 1.0, seed)
    )
    return {
        **fig,
        "lag_p50": lags[len(lags) // 2] if lags else None,
        "lag_p99": lags[min(len(lags) - 1, int(0.99 * len(lags)))] if lags else None,
        "rebuild": peer.rebuild_check(lags, rate),
    }


def run_peer(
    url: str,
    tokenizer_dir: Path,
    result_dir: Path,
    *,
    rate: float,
    count: int,
    seed: int,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Run ``vllm bench serve`` (``count`` requests at ``rate``, then ``extra``)
    between two idle servers; the figures both loops compare, in seconds."""
    argv = peer.command(
        VLLM_PYTHON.parent.parent,
        url,
        tokenizer_dir,
        rate=rate,
        count=count,
        burstiness=1.0,
        seed=seed,
        prompt_tokens=PROMPT,
        output_tokens=OUTPUT,
        result_dir=result_dir,
    )
    argv[argv.index("--model") + 1] = MODEL
    wait_idle(url)
    done = subprocess.run(
        [*argv, *extra],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    if done.returncode != 0:
        raise SystemExit(f"vllm bench serve: {done.stderr[-2000:]}")
    wait_idle(url)
    data = json.loads((result_dir / "result.json").read_text())
    return {
        "ok": data["completed"],
        "requests": count,
        "ttft_p50": data["median_ttft_ms"] / 1000,
        "ttft_p99": data["p99_ttft_ms"] / 1000,
        "tpot_mean": data["mean_tpot_ms"] / 1000,
        "out_tok_s": data["output_throughput"],
    }


@contextlib.contextmanager
def watched(url: str, probe_interval: float) -> Iterator[dict[str, int]]:
    """``servemon exporter`` on ``url`` with its probe, scraped every second."""
    proc = subprocess.Popen(
        [
            str(SERVEMON),
            "exporter",
            "--no-gpu",
            "--target",
            f"vllm={url}",
            "--listen",
            "127.0.0.1:0",
            "--probe-interval",
            f"{probe_interval:g}",
            "--probe-max-tokens",
            "8",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    counts = {"scrapes": 0, "failed": 0}
    stop = threading.Event()
    try:
        assert proc.stdout is not None
        metrics = None
        deadline = time.monotonic() + 60
        while metrics is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if found := re.search(r"serving (http://\S+/metrics)", line):
                metrics = found.group(1)
        if metrics is None:
            raise SystemExit("servemon exporter did not start")

        def scrape() -> None:
            while not stop.wait(1.0):
                try:
                    with urllib.request.urlopen(metrics, timeout=2.5) as resp:
                        resp.read()
                    counts["scrapes"] += 1
                except OSError:
                    counts["failed"] += 1

        thread = threading.Thread(target=scrape, daemon=True)
        thread.start()
        yield counts
    finally:
        stop.set()
        proc.terminate()
        proc.wait(timeout=30)


def print_pairs(
    pairs: dict[str, dict[str, list[dict[str, Any]]]], level: str, *, lags: bool
) -> None:
    """One markdown table of servemon beside the peer at each level, medians of the
    repeats, and their ratios."""
    print()
    head = f"| {level} | client | ok/sent | TTFT p50 ms | TTFT p99 ms | TPOT mean ms "
    head += "| out tok/s |" + (" send lag p50 / p99 ms |" if lags else "")
    print(head)
    print("|" + " --- |" * (8 if lags else 7))
    for at, pair in pairs.items():
        for who, runs_of in pair.items():
            out_tok = med([r["out_tok_s"] for r in runs_of])
            ok = sum(r["ok"] for r in runs_of)
            sent = sum(r["requests"] for r in runs_of)
            cells = [
                at,
                who,
                f"{ok}/{sent}",
                ms(med([r["ttft_p50"] for r in runs_of])),
                ms(med([r["ttft_p99"] for r in runs_of])),
                ms(med([r["tpot_mean"] for r in runs_of])),
                "-" if out_tok is None else f"{out_tok:.0f}",
            ]
            if lags:
                cells.append(
                    f"{ms(med([r['lag_p50'] for r in runs_of]))} / "
                    f"{ms(med([r['lag_p99'] for r in runs_of]))}"
                )
            print("| " + " | ".join(cells) + " |")
        ratios = []
        for key in ("ttft_p50", "ttft_p99", "tpot_mean", "out_tok_s"):
            x = med([r[key] for r in pair["servemon"]])
            y = med([r[key] for r in pair["vllm"]])
            ratios.append(f"{x / y:.2f}" if x and y else "-")
        print(
            f"| {at} | servemon / vllm | | {' | '.join(ratios)} |"
            + (" |" if lags else "")
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[4.0, 12.0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--number", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--probe-interval", type=float, default=5.0)
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()
    print(
        f"# vllm_peers on {platform.node()} ({os.cpu_count()} CPUs), "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        flush=True,
    )
    got: dict[str, Any] = {"peer": {}, "closed": {}, "watch": {"off": [], "on": []}}
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        url, _log = stack.enter_context(vllm_process(work))
        hf = work / "model" / "hf"
        tokenizer = str(hf / "tokenizer.json")
        runs = work / "runs"
        for rate in args.rates:
            pair: dict[str, list[dict[str, Any]]] = {"servemon": [], "vllm": []}
            for seed in range(args.repeats):
                order = ["servemon", "vllm"] if seed % 2 == 0 else ["vllm", "servemon"]
                for who in order:
                    if who == "servemon":
                        fig = ours(url, tokenizer, runs, rate, args.seconds, seed)
                    else:
                        fig = theirs(url, hf, runs, rate, args.seconds, seed)
                    pair[who].append(fig)
                    print(
                        f"{rate:g} req/s seed {seed} {who}: {json.dumps(fig)}",
                        flush=True,
                    )
            got["peer"][f"{rate:g}"] = pair
        for level in args.concurrency:
            pair = {"servemon": [], "vllm": []}
            for seed in range(args.repeats):
                order = ["servemon", "vllm"] if seed % 2 == 0 else ["vllm", "servemon"]
                for who in order:
                    if who == "servemon":
                        fig = ours_closed(url, tokenizer, runs, level, args.number)
                    else:
                        fig = theirs_closed(url, hf, runs, level, args.number, seed)
                    pair[who].append(fig)
                    print(
                        f"concurrency {level} seed {seed} {who}: {json.dumps(fig)}",
                        flush=True,
                    )
            got["closed"][str(level)] = pair
        top = max(args.rates)
        for seed in range(args.repeats):
            order = ["off", "on"] if seed % 2 == 0 else ["on", "off"]
            for mode in order:
                with contextlib.ExitStack() as watch:
                    counts = (
                        watch.enter_context(watched(url, args.probe_interval))
                        if mode == "on"
                        else None
                    )
                    fig = ours(url, tokenizer, runs, top, args.seconds, 100 + seed)
                fig["scrapes"] = counts
                got["watch"][mode].append(fig)
                print(f"watch {mode} seed {100 + seed}: {json.dumps(fig)}", flush=True)
    print_pairs(got["peer"], "rate", lags=True)
    print_pairs(got["closed"], "in flight", lags=False)
    print()
    print("| exporter + probe | TTFT p50 ms | TTFT p99 ms | out tok/s | scrapes |")
    print("| --- | --- | --- | --- | --- |")
    for mode in ("off", "on"):
        rows = got["watch"][mode]
        scrapes = [r["scrapes"] for r in rows if r["scrapes"]]
        print(
            f"| {mode} | {spread([r['ttft_p50'] for r in rows])} "
            f"| {spread([r['ttft_p99'] for r in rows])} "
            f"| {spread([r['out_tok_s'] for r in rows], 1.0)} "
            f"| {scrapes or '-'} |"
        )
    if args.json:
        args.json.write_text(json.dumps(got, indent=1))


if __name__ == "__main__":
    main()
