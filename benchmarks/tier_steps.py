"""Two SLO tiers in one capacity search against two searches of one tier each:
the steps each measures and the capacities each finds (issue #44).

The same target, the same flags, three ``servemon capacity`` runs in turn: one
with both tiers (``--slo strict=... --slo loose=...``), then one per tier. The
target is the built-in simulator (``--profile tiny --max-num-seqs 2``, its own
process) unless ``--target URL`` names a server started by hand (the real vLLM:
docs/capacity.md says how). Constant arrivals, so that a step's verdict depends on
its rate rather than on a Poisson draw, and the searches differ in how they search.

    PYTHONPATH=$PWD:$PWD/benchmarks .venv/bin/python benchmarks/tier_steps.py \\
        [--target URL] [--rounds 1] [-- EXTRA FLAGS FOR servemon capacity]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from _common import SERVEMON, sim_process

STRICT = "ttft_p95<=0.05"
LOOSE = "e2e_p95<=2"
SIM_FLAGS = ("--profile", "tiny", "--max-num-seqs", "2")
SEARCH = (
    "--workload", "random:prompt=16,output=16", "--ignore-eos",
    "--arrival", "constant", "--rps-min", "2", "--precision", "0.25",
    "--step-seconds", "3", "--settle", "1", "--max-duration", "300",
    "--metrics-port", "0",
)  # fmt: skip


def search(
    target: str, slos: Sequence[str], extra: Sequence[str], out: Path
) -> dict[str, Any]:
    """One capacity search; what its summary says, with its wall time."""
    slo_flags = [flag for slo in slos for flag in ("--slo", slo)]
    argv = [
        str(SERVEMON), "capacity", "--target", target, *SEARCH, *slo_flags,
        *extra, "--out", str(out),
    ]  # fmt: skip
    began = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    wall = time.monotonic() - began
    if done.returncode not in (0, 1):
        raise SystemExit(
            f"servemon capacity failed ({done.returncode}):\n{done.stderr}"
        )
    (run,) = sorted(p for p in out.iterdir() if p.is_dir())[-1:]
    found = json.loads((run / "summary.json").read_text())["capacity"]
    tiers = found.get("tiers") or [
        {"name": slos[0].partition("=")[0], "capacity_rps": found["capacity_rps"]}
    ]
    return {
        "steps": len(found["steps"]),
        "capacities": {t["name"]: t["capacity_rps"] for t in tiers},
        "wall_s": wall,
        "step_s": sum(s.get("duration_s") or 0.0 for s in found["steps"]),
    }


@contextlib.contextmanager
def target_of(given: str | None) -> Iterator[str]:
    if given is not None:
        yield given
        return
    with sim_process(*SIM_FLAGS) as url:
        yield url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="a server started by hand (default: sim)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--strict", default=STRICT)
    parser.add_argument("--loose", default=LOOSE)
    parser.add_argument("extra", nargs="*", help="more flags for servemon capacity")
    args = parser.parse_args()
    strict, loose = f"strict={args.strict}", f"loose={args.loose}"
    print(f"tiers: {strict}  {loose}; {' '.join(SEARCH)} {' '.join(args.extra)}")
    print("round  search        steps  strict rps  loose rps  wall s")
    with target_of(args.target) as url, tempfile.TemporaryDirectory() as tmp:
        for n in range(1, args.rounds + 1):
            runs = {
                "both tiers": (strict, loose),
                "strict alone": (strict,),
                "loose alone": (loose,),
            }
            for name, slos in runs.items():
                out = Path(tmp) / f"{n}-{name.replace(' ', '-')}"
                out.mkdir()
                got = search(url, slos, args.extra, out)
                caps = got["capacities"]
                print(
                    f"{n:>5}  {name:<12} {got['steps']:>6}  "
                    f"{_rps(caps.get('strict')):>10}  {_rps(caps.get('loose')):>9}  "
                    f"{got['wall_s']:>6.1f}"
                )


def _rps(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


if __name__ == "__main__":
    main()
