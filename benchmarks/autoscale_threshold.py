"""How steady ``servemon autoscale``'s threshold is: the fleet test's capacity search
(``tests/e2e/test_autoscale_fleet.py``: one simulator replica, ``--max-num-seqs 1
--speed 0.05``, Poisson arrivals, ``ttft_p95<=1``, 8 s steps, 2 s settle), run N
times, each read at the capacity step (``--level-at capacity``) and at the SLO's
limit (``--level-at limit``, the default).

    .venv/bin/python benchmarks/autoscale_threshold.py [--runs 6] [--seeds 1]

Each search gets a fresh simulator. ``--seeds 1,2,3`` cycles the seeds over the runs
(the test's seed is 1: its searches differ only by the server's timing).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import SERVEMON, sim_process

from servemon.loadgen.record.saturation import saturation_point

SIM = ("--profile", "tiny", "--speed", "0.05", "--max-num-seqs", "1")
SEARCH = (
    *("--slo", "ttft_p95<=1", "--workload", "random:prompt=16,output=8"),
    *("--arrival", "poisson", "--rps-min", "3", "--step-seconds", "8"),
    *("--settle", "2", "--precision", "0.2", "--max-duration", "60"),
    *("--sample-interval", "0.25"),
)
HEADROOM = 0.2


def search(out: Path, seed: int) -> Path:
    """One capacity search on a fresh simulator; its run directory."""
    with sim_process(*SIM) as url:
        command = [
            str(SERVEMON),
            "capacity",
            *("--target", url, *SEARCH, "--seed", str(seed)),
            *("--metrics-port", "0", "--out", str(out)),
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed: {done.stderr}")
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


def spread(name: str, values: list[float]) -> str:
    low, high = min(values), max(values)
    return (
        f"{name}: level {low:.2f}-{high:.2f} (x{high / max(low, 1e-9):.1f}), "
        f"threshold {low * (1 - HEADROOM):.2f}-{high * (1 - HEADROOM):.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--seeds", default="1")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    at_capacity: list[float] = []
    at_limit: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.runs):
            seed = seeds[n % len(seeds)]
            run_dir = search(Path(tmp) / f"run-{n}", seed)
            capacity = saturation_point(run_dir, at="capacity")
            limit = saturation_point(run_dir)
            at_capacity.append(capacity.value)
            at_limit.append(limit.value)
            between = (
                f"between {limit.below.rate:g} and {limit.above.rate:g} req/s"
                if limit.below is not None and limit.above is not None
                else "at the capacity step (no step on each side)"
            )
            print(
                f"run {n + 1} (seed {seed}): capacity {capacity.capacity_rps:g} "
                f"req/s; queue there {capacity.value:.2f}; at the limit "
                f"{limit.value:.2f} ({between})",
                flush=True,
            )
    print(spread("at the capacity step", at_capacity))
    print(spread("at the SLO's limit", at_limit))


if __name__ == "__main__":
    main()
