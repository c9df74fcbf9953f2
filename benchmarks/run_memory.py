"""Memory of a long run: peak RSS of ``servemon ramp`` over many requests, and of
``servemon report`` on the run directory it leaves.

A ramp of ``--requests`` requests (default 1,000,000) is sent open loop at
``--rate`` against the benchmark stream server (``_stream_server.py``, answers at
once, ``--chunks`` content chunks each), everything recorded as in any run
(requests.jsonl, live /metrics, summaries). While it runs, the load generator's
RSS is read from /proc every second beside the number of requests it has
recorded; the growth per request is the slope of RSS against requests after the
first ``--warmup`` share of them (a least-squares line). Then ``servemon report``
is run on the directory under ``/usr/bin/time -v`` for its peak RSS and time.

    python benchmarks/run_memory.py [--requests 1000000] [--rate 1000] [--chunks 8]

The client runs on CPU 1 and the server on CPU 0 where the machine has two.
Prints one Markdown table row per measurement; record them in results/memory.md.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from loadgen_rate import stream_server  # the same server, pinned to CPU 0

SERVEMON = Path(sys.executable).parent / "servemon"


def _status_kb(pid: int, field: str) -> int | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    return int(match.group(1)) if match else None


class LineCounter:
    """Counts the lines of a growing file by reading what was appended."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.offset = 0
        self.lines = 0

    def count(self, out: Path) -> int:
        if self.path is None:
            found = sorted(out.glob("*/requests.jsonl"))
            if not found:
                return 0
            self.path = found[0]
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read()
        self.offset += len(chunk)
        self.lines += chunk.count(b"\n")
        return self.lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--warmup", type=float, default=0.2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    seconds = args.requests / args.rate
    out = args.out or Path(tempfile.mkdtemp(prefix="servemon-memory-"))
    pin = ["taskset", "-c", "1"] if (os.cpu_count() or 1) > 1 else []
    samples: list[tuple[int, int]] = []
    with stream_server(args.chunks, None) as (url, _pid):
        command = [
            *pin,
            str(SERVEMON),
            "ramp",
            "--target",
            url,
            "--stages",
            f"{args.rate:g}:{seconds:g}",
            "--arrival",
            "constant",
            "--workload",
            "random:prompt=16,output=8",
            "--max-requests",
            str(args.requests),
            "--metrics-port",
            "0",
            "--out",
            str(out),
        ]
        started = time.monotonic()
        proc = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        counter = LineCounter()
        peak_kb = 0
        while proc.poll() is None:
            time.sleep(1.0)
            rss = _status_kb(proc.pid, "VmRSS")
            hwm = _status_kb(proc.pid, "VmHWM")
            done = counter.count(out)
            if hwm is not None:
                peak_kb = max(peak_kb, hwm)
            if rss is not None and done:
                samples.append((done, rss))
        wall = time.monotonic() - started
        if proc.returncode != 0:
            assert proc.stderr is not None
            raise SystemExit(f"servemon ramp failed: {proc.stderr.read()[-2000:]}")
    run_dir = counter.path.parent if counter.path else None
    if run_dir is None:
        raise SystemExit("no run directory")
    done = counter.count(out)
    # Growth after warm-up: RSS against requests recorded, while sending.
    steady = [(n, kb) for n, kb in samples if n >= args.warmup * args.requests]
    steady = [(n, kb) for n, kb in steady if n < done]  # before the final report
    slope = statistics.linear_regression(
        [float(n) for n, _ in steady], [kb * 1024.0 for _, kb in steady]
    ).slope
    during = max(kb for _, kb in steady) / 1024
    first = steady[0][1] / 1024
    print(
        f"ramp: {done} requests in {wall:.0f} s ({done / wall:.0f} req/s), "
        f"RSS {first:.0f} MB at {steady[0][0]} requests -> {during:.0f} MB while "
        f"sending; growth {slope:.2f} bytes/request after warm-up; peak RSS "
        f"(VmHWM, including the end-of-run report) {peak_kb / 1024:.0f} MB"
    )
    report = subprocess.run(
        ["/usr/bin/time", "-v", str(SERVEMON), "report", str(run_dir)],
        capture_output=True,
        text=True,
        check=True,
    )
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", report.stderr)
    elapsed = re.search(r"Elapsed \(wall clock\) time.*: (\S+)", report.stderr)
    size = (run_dir / "requests.jsonl").stat().st_size / 2**20
    print(
        f"report: requests.jsonl {size:.0f} MiB; peak RSS "
        f"{int(rss.group(1)) / 1024 if rss else float('nan'):.0f} MB; "
        f"wall {elapsed.group(1) if elapsed else '?'}"
    )
    print(f"run directory: {run_dir}")


if __name__ == "__main__":
    main()
