"""How well ``servemon control`` holds each signal on the simulator, and follows a
change of the server's speed back to the setpoint.

For each signal (``waiting``, ``kv_cache_usage``, ``ttft_p95``) a ``servemon sim``
is started with an engine shaped so that the setpoint sits inside its range (a
batch limit for the queue, long-lived requests for KV usage, 1,024-token prompts
for TTFT), and ``servemon control
--hold SIGNAL=SETPOINT`` runs for ``--soak`` seconds against it, as a user runs it
(Poisson arrivals, the signal read from the target's ``/metrics``, every 0.5 s for
the queue and KV usage, no real-time scheduling; ``--pace`` passes ``--pace``, the
TTFT law's pace on the sends; ``--seed`` passes ``--seed``: every run of a seed draws
the same arrivals, so variants compare on the same draws and repeats take other
seeds). Halfway through, the simulator's
speed is changed (``PUT /sim/config {"speed": ...}``): the server gets slower and the
same rate means a different signal. From ``control.jsonl`` it prints, for each half
after its settle time, the share of control ticks whose measured signal was within
±15 % of the setpoint, the signal's median and the median offered rate.

    .venv/bin/python benchmarks/control_hold.py [--soak 600] [--signals waiting,...]

With ``--pin RATE`` the law's rate is pinned (``--rps-min = --rps-max = RATE``) and
no speed change is made: for ``ttft_p95``, runs with and without ``--no-pace``
print the share of 30-s p95s within ±15 % of their own median: the noise floor of
the signal itself, which the pace on the sends lowers (``loadgen/backlog.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from _common import SERVEMON, sim_process

#: signal -> (setpoint, simulator flags, control flags)
CASES: dict[str, tuple[float, list[str], list[str]]] = {
    "waiting": (
        64.0,
        ["--max-num-seqs", "32"],
        ["--workload", "random:prompt=64,output=32", "--sample-interval", "0.5"],
    ),
    # Long-lived requests (512 output tokens, ~25 s each): KV usage moves on the
    # timescale of a lifetime, which the controller can follow. With short ones
    # (32 tokens, ~2 s) it moves faster than an interval and a fixed rate holds it
    # no better than the controller (RESULTS.md).
    "kv_cache_usage": (
        0.7,
        ["--max-num-seqs", "256"],
        [
            "--workload",
            "random:prompt=256,output=512",
            "--ignore-eos",
            "--sample-interval",
            "0.5",
            "--control-interval",
            "4",
            "--rps-start",
            "2",
        ],
    ),
    # Long prompts and no batch limit: TTFT is the wait for the prefill budget
    # (2,048 tokens a step), a stationary queue below its knee, so a function of
    # the rate; behind a batch limit it is a drifting queue (see docs/capacity.md).
    "ttft_p95": (
        0.4,
        ["--max-num-seqs", "256"],
        [
            "--workload",
            "random:prompt=1024,output=32",
            "--signal-window",
            "30",
            "--control-interval",
            "10",
            # From 4 req/s the integral step at 10 s intervals took 200 s to climb.
            "--rps-start",
            "8",
        ],
    ),
}
SPEED_AFTER = 0.7
TOLERANCE = 0.15


def _slow_down(url: str, at: float) -> None:
    time.sleep(max(0.0, at - time.monotonic()))
    body = json.dumps({"speed": SPEED_AFTER}).encode()
    request = urllib.request.Request(
        url + "/sim/config",
        data=body,
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5):
        pass


def _half(ticks: list[dict[str, float]], setpoint: float) -> dict[str, float]:
    measured = [t["measured"] for t in ticks if t["measured"] is not None]
    inside = sum(abs(m - setpoint) <= TOLERANCE * setpoint for m in measured)
    return {
        "ticks": len(ticks),
        "within": inside / len(ticks) if ticks else 0.0,
        "median": statistics.median(measured) if measured else float("nan"),
        "offered": statistics.median(t["offered_rps"] for t in ticks)
        if ticks
        else float("nan"),
    }


def run_case(
    signal: str, soak: float, settle: float, work: Path, pace: bool, seed: int
) -> list[str]:
    setpoint, sim_args, control_args = CASES[signal]
    out = work / signal
    with sim_process("--profile", "qwen3-0.6b-eager", *sim_args) as url:
        switch_at = time.monotonic() + soak / 2
        slower = threading.Thread(target=_slow_down, args=(url, switch_at))
        slower.start()
        command = [
            str(SERVEMON), "control", "--target", url,
            "--hold", f"{signal}={setpoint:g}", "--duration", f"{soak:g}",
            "--rps-start", "4", "--metrics-port", "0", "--out", str(out),
            "--seed", str(seed), *control_args, *(["--pace"] if pace else []),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        slower.join()
    if done.returncode != 0:
        raise SystemExit(f"servemon control failed: {done.stderr[-2000:]}")
    (run,) = out.glob("*-control")
    ticks = [json.loads(x) for x in (run / "control.jsonl").read_text().splitlines()]
    summary = json.loads((run / "summary.json").read_text())
    start = float(summary["stages"][0]["start_s"])
    first = [t for t in ticks if settle <= t["t_s"] - start < soak / 2]
    second = [t for t in ticks if soak / 2 + settle <= t["t_s"] - start]
    rows = []
    for name, part in (("before", first), (f"after speed {SPEED_AFTER:g}", second)):
        h = _half(part, setpoint)
        rows.append(
            f"{signal:<15} {setpoint:>8g} {name:<17} {h['ticks']:>5.0f} "
            f"{h['within']:>7.0%} {h['median']:>8.3f} {h['offered']:>8.2f}"
        )
    return rows


def pinned(signal: str, rate: float, soak: float, settle: float, work: Path) -> None:
    """The signal's own spread at a pinned rate, paced and not (see the module)."""
    setpoint, sim_args, control_args = CASES[signal]
    pin = [f"--rps-{x}={rate:g}" for x in ("start", "min", "max")]
    print(
        f"{'pace':<8} {'ticks':>5} {'within':>7} {'median':>8} {'range':>13} {'rps':>6}"
    )
    for pace in ("--pace", "--no-pace"):
        out = work / f"pinned{pace}"
        with sim_process("--profile", "qwen3-0.6b-eager", *sim_args) as url:
            command = [
                str(SERVEMON), "control", "--target", url,
                "--hold", f"{signal}={setpoint:g}", "--duration", f"{soak:g}",
                "--metrics-port", "0", "--out", str(out), *control_args, *pin, pace,
            ]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"servemon control failed: {done.stderr[-2000:]}")
        (run,) = out.glob("*-control")
        lines = (run / "control.jsonl").read_text().splitlines()
        start = json.loads((run / "summary.json").read_text())["stages"][0]["start_s"]
        ticks = [json.loads(x) for x in lines]
        seen = [
            t["measured"]
            for t in ticks
            if t["measured"] is not None and t["t_s"] - float(start) >= settle
        ]
        median = statistics.median(seen)
        inside = sum(abs(m - median) <= TOLERANCE * median for m in seen) / len(seen)
        sent = statistics.mean(t["achieved_rps"] for t in ticks[1:])
        print(
            f"{pace.lstrip('-'):<8} {len(seen):>5} {inside:>7.0%} {median:>8.3f} "
            f"{min(seen):>6.3f}-{max(seen):.3f} {sent:>6.2f}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--soak", type=float, default=600.0)
    parser.add_argument("--settle", type=float, default=60.0)
    parser.add_argument("--signals", default="waiting,kv_cache_usage,ttft_p95")
    parser.add_argument(
        "--keep", type=Path, default=None, help="keep the run directories here"
    )
    parser.add_argument(
        "--pace", action="store_true", help="servemon control --pace (ttft_p95)"
    )
    parser.add_argument(
        "--pin", type=float, default=None, help="pin the rate (see the module)"
    )
    parser.add_argument("--seed", type=int, default=0, help="servemon control --seed")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="control-hold-"))
    if args.pin is not None:
        print(
            f"control_hold --pin: servemon control at a pinned {args.pin:g} req/s "
            f"against servemon sim (qwen3-0.6b-eager), {args.soak:g} s each, "
            f"Poisson arrivals, the first {args.settle:g} s not judged"
        )
        for signal in args.signals.split(","):
            pinned(signal, args.pin, args.soak, args.settle, work)
        if args.keep is None:
            subprocess.run(["rm", "-rf", str(work)], check=False)
        return
    print(
        f"control_hold: servemon control against servemon sim (qwen3-0.6b-eager); "
        f"{args.soak:g} s a signal, the speed changed to {SPEED_AFTER:g} at half "
        f"time; Poisson arrivals (seed {args.seed}); the first {args.settle:g} s of "
        "each half not judged"
    )
    print(
        f"{'signal':<15} {'setpoint':>8} {'half':<17} {'ticks':>5} {'within':>7} "
        f"{'median':>8} {'rps':>8}"
    )
    for signal in args.signals.split(","):
        for row in run_case(signal, args.soak, args.settle, work, args.pace, args.seed):
            print(row, flush=True)
    if args.keep is None:
        subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    main()
