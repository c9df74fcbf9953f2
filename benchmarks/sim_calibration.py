"""Calibration of the ``qwen3-0.6b-eager`` profile against the course measurement.

The course (shared seeds, 000) served Qwen3-0.6B with vLLM ``--enforce-eager
--max-num-seqs 8`` and measured it with EvalScope: 128 prompt / 128 output tokens,
concurrency 1, 2, 4, 8, 16 requests per level after 8 warm-up requests. This script
runs the same sweep against ``servemon sim`` with servemon's own client and prints
TTFT, TPOT and output throughput per level beside the course's figures.

    .venv/bin/python benchmarks/sim_calibration.py [--number 16] [--warmup 8]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import random

from _common import sim_process

from servemon.loadgen.record.summary import summarize
from servemon.loadgen.send.client import ClientSettings, make_session
from servemon.loadgen.send.closedloop import run_closed_loop
from servemon.loadgen.workloads.workload import chat_body, random_prompt

# EvalScope report in the course: concurrency -> (TTFT ms, TPOT ms, output tok/s)
COURSE = {
    1: (62.59, 27.86, 35.50),
    4: (87.09, 28.80, 113.83),
    8: (88.24, 28.93, 187.08),
}


async def sweep(url: str, levels: list[int], number: int, warmup: int) -> list[str]:
    rows = []
    rng = random.Random(0)
    async with make_session(ClientSettings()) as session:
        for level in levels:
            prompts = [random_prompt(rng, 128) for _ in range(number + warmup)]
            timings = await run_closed_loop(
                session,
                url + "/v1/chat/completions",
                lambda i, p=prompts: chat_body("Qwen3-0.6B", p[i], 128),
                concurrency=level,
                number=number,
                warmup=warmup,
                id_prefix=f"c{level}",
            )
            s = summarize(timings)
            ttft, tpot = s.figure("ttft"), s.figure("tpot")
            if ttft is None or tpot is None:
                raise SystemExit(f"concurrency {level}: no successful requests")
            course = COURSE.get(level)
            ref = (
                f"{course[0]:.1f} | {course[1]:.2f} | {course[2]:.1f}"
                if course
                else "- | - | -"
            )
            rows.append(
                f"| {level} | {s.outcomes.get('ok', 0)}/{s.requests} "
                f"| {s.mean_prompt_tokens or 0:.0f} | {s.mean_output_tokens or 0:.1f} "
                f"| {ttft.mean * 1000:.1f} | {tpot.mean * 1000:.2f} "
                f"| {s.output_throughput:.1f} | {ref} |"
            )
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 4, 8])
    args = parser.parse_args()
    print(f"# sim_calibration on {platform.node()} ({platform.python_version()})")
    print(
        "| concurrency | ok | mean prompt | mean output | TTFT ms | TPOT ms "
        "| output tok/s | course TTFT ms | course TPOT ms | course tok/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    with sim_process(
        "--profile", "qwen3-0.6b-eager", "--max-num-seqs", "8", "--seed", "0"
    ) as url:
        asyncio.run(sweep(url, args.levels, args.number, args.warmup))


if __name__ == "__main__":
    main()
