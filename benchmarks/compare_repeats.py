"""How often ``servemon compare`` calls a figure different when nothing is, and
whether it finds a 20 % slower simulator, over real runs.

Each trial runs ``servemon ramp --repeats R`` three times against the embedded
simulator (its own process, as a user runs it): twice the same configuration with
different seeds, and once at ``--speed 0.8`` (every engine step 1.25 times as
long). It prints, per trial, every figure the same-configuration pair called
"faster" or "slower", and for the slow run each judged figure's verdict and
whether its interval holds 1.25; then the counts. The profile is the ``tiny``
one with 40 ms steps (whole milliseconds at both speeds: the simulator sleeps on
an event loop whose timer rounds up to whole milliseconds).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/compare_repeats.py --trials 20
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from _common import SERVEMON

from servemon.loadgen.reports.compare import compare, verdict_text

PROFILE = """\
name: tiny-40ms
model: sim-tiny
params: 5.0e7
bytes_per_param: 2
kv_bytes_per_token: 16384
memory_bandwidth: 1.0e12
compute_flops: 2.0e13
step_overhead_s: 0.0399
per_seq_overhead_s: 0.0000005
frontend_latency_s: 0.0
num_gpu_blocks: 4096
block_size: 16
max_model_len: 4096
eos_probability: 0.0
"""
TRUE_RATIO = 1.25
DIFFERENT = ("faster", "slower")


def ramp(
    out: Path, profile: Path, args: argparse.Namespace, seed: int, speed: float
) -> Path:
    command = [
        str(SERVEMON),
        "ramp",
        "--stages",
        args.stages,
        "--repeats",
        str(args.repeats),
        "--workload",
        "random:prompt=16,output=16",
        "--seed",
        str(seed),
        "--energy",
        "off",
        "--metrics-port",
        "0",
        "--sim-profile",
        str(profile),
        f"--sim-arg=--speed={speed}",
        "--out",
        str(out),
    ]
    subprocess.run(command, check=True, capture_output=True)
    (run_dir,) = (p for p in out.iterdir() if p.is_dir())
    return run_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stages", default="20:1,40:1")
    args = parser.parse_args()
    false_calls = found = covered = judged = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        profile = root / "tiny-40ms.yaml"
        profile.write_text(PROFILE, encoding="utf-8")
        for t in range(args.trials):
            a = ramp(root / f"{t}-a", profile, args, 3 * t + 1, 1.0)
            b = ramp(root / f"{t}-b", profile, args, 3 * t + 2, 1.0)
            slow = ramp(root / f"{t}-slow", profile, args, 3 * t + 3, 0.8)
            c = compare([a, b, slow])
            same, slower = c.differences
            called = [
                f"{level} {figure}: {verdict_text(d)}"
                for (level, figure), d in same.items()
                if d.verdict in DIFFERENT
            ]
            false_calls += bool(called)
            latency = [
                d
                for d in slower.values()
                if d.confidence is not None and not d.figure.endswith(("/s", "rate"))
            ]
            judged += len(latency)
            found += sum(d.verdict == "slower" for d in latency)
            covered += sum(
                d.low is not None
                and d.high is not None
                and d.low <= TRUE_RATIO <= d.high
                for d in latency
            )
            print(f"trial {t + 1}: same configuration: {'; '.join(called) or 'none'}")
            for d in latency:
                print(f"  slow: {d.level} {d.figure}: {verdict_text(d)}")
    print(
        f"same configuration called different in {false_calls} of {args.trials} "
        f"trials; slow run: {found} of {judged} latency figures judged 'slower', "
        f"{covered} of {judged} intervals hold {TRUE_RATIO}"
    )


if __name__ == "__main__":
    main()
