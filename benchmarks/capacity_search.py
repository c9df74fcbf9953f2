"""``servemon capacity`` against a linear sweep at the same precision: the wall time
each takes and the capacity each finds.

The simulator (``--profile tiny --max-num-seqs 8 --speed 0.02``: 8 batch slots, an
engine step of about 45 ms) runs as a subprocess, as does every servemon command
(``--pin``: the simulator on CPU 0 and servemon on CPU 1). Requests are 16 random
words and 16 output tokens (``ignore_eos``), so each holds a batch slot for about 17
steps and the engine saturates near ``8 / (17 x 45 ms)`` = 10.5 requests a second
(less on a busy machine, where every step runs a little late).
Arrivals are constant (``--arrival``): below saturation nothing queues, above it the
queue grows every second, so a step's verdict depends on the rate and not on the luck
of a Poisson draw, and the two methods are compared on how they search rather than
on noise.

1. ``servemon capacity --precision P --rps-min R0 --step-seconds S --settle T``.
2. ``servemon ramp --rps-start R0 --rps-end TOP --rps-step W --step-seconds S``:
   the range the search covered (TOP: the highest rate it tried), at the step that
   gives the same precision around the capacity (W = P x the capacity found). Its
   capacity is the highest stage meeting the SLO, judged as the search judges a step:
   on the requests scheduled after the settle time.
3. Ramps of one step at 0.8x and 1.3x the capacity found, judged the same way: the
   first should meet the SLO, the second break it.

    .venv/bin/python benchmarks/capacity_search.py [--precision 0.1] [--step-seconds 5]
        [--arrival constant|poisson] [--pin]

Wall times are of the whole command (process start-up and the report included);
"run" is from the run's clock origin to its end as run.json records them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Any

from _common import SERVEMON, sim_process

from servemon.core.slo import parse_slo
from servemon.loadgen.record.line import timing_from_line
from servemon.loadgen.record.summary import summarize
from servemon.simulator.profiles import load_profile

SIM_CPU, CLIENT_CPU = 0, 1
SEQS, SPEED, OUTPUT = 8, 0.02, 16
WORKLOAD = f"random:prompt=16,output={OUTPUT}"


@dataclass(frozen=True, slots=True)
class Outcome:
    """One servemon command: how long it took and its run directory."""

    wall_s: float
    run_dir: Path
    run: dict[str, Any]
    summary: dict[str, Any]

    @property
    def run_s(self) -> float:
        start = datetime.fromisoformat(self.run["clock_origin"]["utc"])
        end = datetime.fromisoformat(self.run["ended_utc"])
        return (end - start).total_seconds()

    @property
    def sent(self) -> int:
        return sum(int(s["sent"]) for s in self.summary["stages"])


def servemon(*args: str, out: Path, pin: bool) -> Outcome:
    """Run ``servemon ARGS --out OUT`` (pinned to the client's CPU if ``pin``)."""
    command = [str(SERVEMON), *args, "--metrics-port", "0", "--out", str(out)]
    if pin and (os.cpu_count() or 1) > CLIENT_CPU:
        command = ["taskset", "-c", str(CLIENT_CPU), *command]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr}")
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return Outcome(
        wall,
        run_dir,
        json.loads((run_dir / "run.json").read_text(encoding="utf-8")),
        json.loads((run_dir / "summary.json").read_text(encoding="utf-8")),
    )


def stage_verdicts(result: Outcome, slo: str, settle_s: float) -> list[bool]:
    """Each stage judged as the search judges a step: every SLO term, on the ok
    requests scheduled after ``settle_s``."""
    origin = float(result.run["clock_origin"]["monotonic_s"])
    lines = [
        json.loads(line)
        for line in (result.run_dir / "requests.jsonl").read_text().splitlines()
    ]
    terms = parse_slo(slo)
    verdicts = []
    for stage in result.summary["stages"]:
        start = origin + float(stage["start_s"]) + settle_s
        mine = [
            timing_from_line(line)
            for line in lines
            if line["stage"] == stage["stage"] and line["scheduled_s"] >= start
        ]
        met = summarize(mine, slo=terms).slo_met or {}
        verdicts.append(bool(mine) and all(met.values()))
    return verdicts


def ttft_p95(result: Outcome, stage: int = 0) -> float | None:
    value = result.summary["stages"][stage]["summary"]["ttft"]
    return None if value is None else float(value["p95"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", type=float, default=0.1)
    parser.add_argument("--rps-min", type=float, default=2.0)
    parser.add_argument("--step-seconds", type=float, default=5.0)
    parser.add_argument("--settle", type=float, default=1.0)
    parser.add_argument("--slo", default="ttft_p95<=0.5")
    parser.add_argument("--arrival", default="constant")
    parser.add_argument(
        "--pin", action="store_true", help="simulator on CPU 0, servemon on CPU 1"
    )
    args = parser.parse_args()

    step_s = load_profile("tiny").step_overhead_s / SPEED
    expected = SEQS / ((OUTPUT + 1) * step_s)
    common = (
        "--slo",
        args.slo,
        "--workload",
        WORKLOAD,
        "--ignore-eos",
        "--arrival",
        args.arrival,
        "--step-seconds",
        f"{args.step_seconds:g}",
    )
    sim_args = ("--profile", "tiny", "--max-num-seqs", str(SEQS), "--speed", str(SPEED))
    began, load_before = time.monotonic(), os.getloadavg()[0]
    with (
        tempfile.TemporaryDirectory(prefix="capacity-bench-") as tmp,
        sim_process(*sim_args, cpu=SIM_CPU if args.pin else None) as url,
    ):
        out = Path(tmp)
        search = servemon(
            "capacity",
            "--target",
            url,
            *common,
            "--precision",
            f"{args.precision:g}",
            "--rps-min",
            f"{args.rps_min:g}",
            "--settle",
            f"{args.settle:g}",
            "--max-duration",
            "600",
            out=out / "capacity",
            pin=args.pin,
        )
        found = search.summary["capacity"]
        capacity = found["capacity_rps"]
        if capacity is None:
            sys.exit(f"the search found no capacity: {found}")
        top = max(step["rate"] for step in found["steps"])
        width = float(f"{args.precision * capacity:.2g}")
        linear = servemon(
            "ramp",
            "--target",
            url,
            *common,
            "--rps-start",
            f"{args.rps_min:g}",
            "--rps-end",
            f"{top:g}",
            "--rps-step",
            f"{width:g}",
            out=out / "linear",
            pin=args.pin,
        )
        verdicts = stage_verdicts(linear, args.slo, args.settle)
        rates = [float(s["target_rate"]) for s in linear.summary["stages"]]
        good = [rate for rate, ok in zip(rates, verdicts, strict=True) if ok]
        linear_capacity = max(good) if good else None
        first_bad = next(
            (rate for rate, ok in zip(rates, verdicts, strict=True) if not ok), None
        )
        checks = []
        for factor in (0.8, 1.3):
            rate = factor * capacity
            check = servemon(
                "ramp",
                "--target",
                url,
                *common[:-2],
                "--stages",
                f"{rate:.4g}:{args.step_seconds:g}",
                out=out / f"check-{factor:g}",
                pin=args.pin,
            )
            checks.append((factor, rate, check))
        check_verdicts = [
            stage_verdicts(check, args.slo, args.settle)[0] for *_, check in checks
        ]
    total = time.monotonic() - began

    print(
        f"capacity_search: {date.today()}, Python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs, load average {load_before:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end"
    )
    print(
        f"simulator: tiny, --max-num-seqs {SEQS}, --speed {SPEED:g} "
        f"(step {step_s * 1000:.0f} ms, saturation about {expected:.1f} req/s); "
        f"workload {WORKLOAD} --ignore-eos; --arrival {args.arrival}; "
        f"--slo {args.slo}; --step-seconds {args.step_seconds:g}, "
        f"--settle {args.settle:g}"
    )
    print()
    header = (
        "method",
        "steps",
        "requests",
        "wall s",
        "run s",
        "capacity req/s",
        "resolution",
    )
    low, high = found["bracket"]
    rows = [
        (
            f"servemon capacity --precision {args.precision:g}",
            str(len(found["steps"])),
            str(search.sent),
            f"{search.wall_s:.1f}",
            f"{search.run_s:.1f}",
            f"{capacity:.4g}",
            f"bracket {low:.4g}-{high:.4g}"
            if high is not None
            else "no breaking rate found",
        ),
        (
            f"linear ramp {args.rps_min:g}..{top:g} step {width:g}",
            str(len(rates)),
            str(linear.sent),
            f"{linear.wall_s:.1f}",
            f"{linear.run_s:.1f}",
            "-" if linear_capacity is None else f"{linear_capacity:.4g}",
            f"first breach {first_bad:.4g}" if first_bad is not None else "none",
        ),
    ]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    for row in (header, tuple("-" * w for w in widths), *rows):
        print(" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    print()
    steps = ", ".join(
        f"{s['rate']:.4g} {'good' if s['good'] else 'bad'}" for s in found["steps"]
    )
    print(f"search steps: {steps}")
    print(f"search ended: {found['ended_because']}")
    print(f"SLO that broke first: {found['first_breach']}")
    print(f"saturated first: {found['saturated_first']}")
    stages = ", ".join(
        f"{rate:g} {'good' if ok else 'bad'}"
        for rate, ok in zip(rates, verdicts, strict=True)
    )
    print(f"linear stages: {stages}")
    for (factor, rate, check), ok in zip(checks, check_verdicts, strict=True):
        p95 = ttft_p95(check)
        shown = "-" if p95 is None else f"{p95 * 1000:.0f} ms"
        print(
            f"check at {factor:g}x = {rate:.4g} req/s: "
            f"{'meets' if ok else 'breaks'} the SLO (stage TTFT p95 {shown})"
        )
    speedup = linear.wall_s / search.wall_s
    faster = "faster" if speedup > 1 else "slower"
    print(
        f"capacity search took {search.wall_s:.1f} s against {linear.wall_s:.1f} s "
        f"for the linear sweep ({speedup:.2f}x {faster}); total {total:.0f} s"
    )
    goal = (
        check_verdicts == [True, False]
        and search.wall_s < linear.wall_s
        and linear_capacity is not None
    )
    verdict = "met" if goal else "NOT met"
    print(f"goal (0.8x meets, 1.3x breaks, faster than linear): {verdict}")


if __name__ == "__main__":
    main()
