"""Does ``servemon ramp`` stay flat over an hour of sustained open-loop load?

``servemon sim --profile tiny`` runs pinned to CPU 0 (``taskset``); one ``servemon
ramp`` stage of ``--rate`` requests/s for ``--minutes`` (Poisson arrivals, open
loop, streamed chat requests of the ``--workload``) runs pinned to CPU 1 against
it, recording as any run does (requests.jsonl flushed per request, the live client
/metrics on a free port, summaries). While it runs, this process reads the load
generator's RSS (``/proc/PID/status`` VmRSS) every ``--every`` seconds; afterwards it
reads requests.jsonl for, per minute of the schedule, the requests, their
outcomes, the dispatch lag (actual send - scheduled send) p50/p99/max and TTFT
p50. The RSS slope is the least-squares line through the samples after
``--settle`` minutes, in MiB/hour.

    .venv/bin/python benchmarks/loadgen_soak.py [--minutes 60] [--rate 20]
        [--workload random:prompt=64,output=32] [--out DIR] [--json PATH]

Exit status is non-zero when the ramp failed or a request did not end ``ok``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import SERVEMON, pin_self, sim_process


def rss_mib(pid: int) -> float | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
    return int(match.group(1)) / 1024 if match else None


def pct(values: list[float], q: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def per_minute(path: Path) -> list[dict[str, object]]:
    """Per minute of the schedule: requests, outcomes, dispatch lag, TTFT."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line]
    if not records:
        return []
    first = min(r["scheduled_s"] for r in records)
    minutes: dict[int, list[dict[str, object]]] = collections.defaultdict(list)
    for r in records:
        minutes[int((r["scheduled_s"] - first) // 60)].append(r)
    rows = []
    for minute in sorted(minutes):
        got = minutes[minute]
        lag = [
            float(r["dispatch_lag_s"])
            for r in got
            if r.get("dispatch_lag_s") is not None
        ]
        ttft = [float(r["ttft_s"]) for r in got if r.get("ttft_s") is not None]
        rows.append(
            {
                "minute": minute,
                "requests": len(got),
                "outcomes": dict(collections.Counter(str(r["outcome"]) for r in got)),
                "lag_p50_ms": pct(lag, 50) * 1000 if lag else None,
                "lag_p99_ms": pct(lag, 99) * 1000 if lag else None,
                "lag_max_ms": max(lag) * 1000 if lag else None,
                "ttft_p50_ms": pct(ttft, 50) * 1000 if ttft else None,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--rate", type=float, default=20)
    parser.add_argument("--workload", default="random:prompt=64,output=32")
    parser.add_argument("--every", type=float, default=10)
    parser.add_argument("--settle", type=float, default=5, help="minutes left out")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="servemon-soak-"))
    pin_self(0)
    pin = ["taskset", "-c", "1"] if (os.cpu_count() or 1) > 1 else []
    seconds = args.minutes * 60
    samples: list[tuple[float, float]] = []  # (minutes since start, RSS MiB)
    with sim_process("--profile", "tiny", cpu=0) as url:
        command = [
            *pin,
            str(SERVEMON),
            "ramp",
            "--target",
            url,
            "--stages",
            f"{args.rate:g}:{seconds:g}",
            "--arrival",
            "poisson",
            "--workload",
            args.workload,
            "--timeout",
            "60",
            "--metrics-port",
            "0",
            "--out",
            str(out),
        ]
        print(" ".join(command), flush=True)
        started = time.monotonic()
        out.mkdir(parents=True, exist_ok=True)
        err_path = out / "ramp.stderr"
        with err_path.open("w") as err:
            proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
        print("minute_at rss_MiB", flush=True)
        next_at = started
        try:
            while proc.poll() is None:
                next_at += args.every
                time.sleep(max(0.0, next_at - time.monotonic()))
                rss = rss_mib(proc.pid)
                if rss is not None and proc.poll() is None:
                    at = (time.monotonic() - started) / 60
                    samples.append((at, rss))
                    print(f"{at:9.2f} {rss:7.1f}", flush=True)
        finally:  # interrupted: the ramp goes too (its own Ctrl-C handling)
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        stderr = err_path.read_text()
        wall = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"servemon ramp failed ({proc.returncode}): {stderr[-2000:]}")
    found = sorted(out.glob("*/requests.jsonl"))
    if not found:
        raise SystemExit("no run directory")
    run_dir = found[-1].parent
    rows = per_minute(found[-1])
    sending = [(t, m) for t, m in samples if t <= args.minutes]
    settled = [(t, m) for t, m in sending if t >= args.settle] or sending
    slope = (
        statistics.linear_regression(
            [t for t, _ in settled], [m for _, m in settled]
        ).slope
        * 60
    )
    slope_all = (
        statistics.linear_regression(
            [t for t, _ in sending], [m for _, m in sending]
        ).slope
        * 60
    )
    print("minute requests outcomes lag_p50_ms lag_p99_ms lag_max_ms ttft_p50_ms")
    for row in rows:
        print(
            f"{row['minute']:>6} {row['requests']:>8} {row['outcomes']} "
            f"{row['lag_p50_ms']:.2f} {row['lag_p99_ms']:.2f} {row['lag_max_ms']:.2f} "
            f"{row['ttft_p50_ms']:.1f}"
        )
    total = collections.Counter()
    for row in rows:
        total.update(row["outcomes"])  # type: ignore[arg-type]
    first = settled[0]
    result = {
        "command": command,
        "wall_s": wall,
        "requests": sum(total.values()),
        "outcomes": dict(total),
        "rss_first_mib": samples[0][1],
        "rss_settled_first_mib": first[1],
        "rss_end_mib": sending[-1][1],
        "rss_max_mib": max(m for _, m in sending),
        "rss_slope_mib_per_hour": slope,
        "rss_slope_all_mib_per_hour": slope_all,
        "minutes": rows,
        "samples": samples,
        "run_dir": str(run_dir),
    }
    print(
        f"ramp: {result['requests']} requests in {wall:.0f} s, outcomes {dict(total)}; "
        f"RSS {samples[0][1]:.1f} MiB at {samples[0][0]:.1f} min, "
        f"{first[1]:.1f} at {first[0]:.1f} min, {sending[-1][1]:.1f} at "
        f"{sending[-1][0]:.1f} min (max {result['rss_max_mib']:.1f}); slope "
        f"{slope:+.2f} MiB/hour after minute {args.settle:g} ({slope_all:+.2f} over "
        f"all); load average {os.getloadavg()[0]:.2f}"
    )
    print(f"run directory: {run_dir}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    sys.exit(0 if set(total) == {"ok"} else 1)


if __name__ == "__main__":
    main()
