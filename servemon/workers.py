"""``servemon ramp --workers N``: one open-loop schedule sent by N processes.

When one process cannot keep its dispatch lag low at the rate asked for, the schedule
is split the way shards split it (every N-th arrival of the same seeded schedule,
:class:`loadgen.send.arrivals.Shard`): N child processes ``servemon ramp --shard i/N``
start together (``--start-at``), each with its own event loop and core, each serving its
live metrics on ``--metrics-port + i`` (Prometheus sums them), and their run
directories are merged into one (:mod:`loadgen.reports.merge`), whose summary and report
are those of the whole load. A terminal's Ctrl-C reaches the workers (they share the
process group) and a SIGTERM to this process is passed on to them; either way this
process waits for them and merges their records however they ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from rich.console import Console

from servemon.core.errors import ServemonError
from servemon.loadgen.reports.merge import merge_runs
from servemon.loadgen.run.config import LoadConfig, config_text, header_lines

__all__ = ["run_workers"]

START_DELAY_S = 4.0


def _worker_config(config: LoadConfig, target: str) -> dict[str, object]:
    """The workers' shared config file: everything but secrets and per-worker flags."""
    data = config_text(config)
    for key in (
        "header",
        "header_file",
        "workers",
        "shard",
        "start_at",
        "metrics_port",
        "out",
    ):
        data.pop(key, None)
    data["target"] = target
    return data


@contextlib.contextmanager
def _header_file(config: LoadConfig) -> Iterator[list[str]]:
    """The run's headers for the workers, as ``--header-file`` arguments: a file
    only this user can read (``mkstemp``), outside the run directories, removed
    when the workers are done; never ``--header`` (a command line is public)."""
    lines = [
        *(header_lines(Path(config.header_file)) if config.header_file else ()),
        *config.header,
    ]
    if not lines:
        yield []
        return
    fd, name = tempfile.mkstemp(prefix="servemon-headers-", text=True)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write("".join(f"{line}\n" for line in lines))
        yield ["--header-file", name]
    finally:
        Path(name).unlink(missing_ok=True)


@contextlib.contextmanager
def _passing_signals_on(
    procs: Sequence[asyncio.subprocess.Process], console: Console
) -> Iterator[None]:
    """While the workers run, a signal to this process reaches them and is not
    the end of it: it waits for them and merges what they recorded. A terminal's
    Ctrl-C reaches the whole process group, so the first SIGINT is the workers'
    already; a SIGTERM (sent to this process alone) is passed on, and so is any
    later signal (the workers then cancel their requests in flight)."""
    loop = asyncio.get_running_loop()
    seen: list[int] = []

    def on_signal(sig: signal.Signals) -> None:
        seen.append(sig)
        if len(seen) == 1:
            console.print("servemon: stopping the workers; their records are merged")
        if sig == signal.SIGTERM or len(seen) > 1:
            for proc in procs:
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        yield
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def run_workers(config: LoadConfig, target: str, console: Console) -> Path:
    """Run the ramp as ``config.workers`` processes; return the merged run directory."""
    n = config.workers
    if n == "auto":
        raise ValueError("run_workers: resolve --workers auto first")
    out = Path(config.out)
    shard_dir = out / f".workers-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S-%f')}"
    shard_dir.mkdir(parents=True)
    config_file = shard_dir / "worker.yaml"
    config_file.write_text(yaml.safe_dump(_worker_config(config, target)))
    at = config.start_at or datetime.now(UTC) + timedelta(seconds=START_DELAY_S)
    start = at.isoformat(timespec="milliseconds")
    with _header_file(config) as headers:
        procs = []
        for i in range(n):
            port = 0 if config.metrics_port == 0 else config.metrics_port + i
            argv: Sequence[str] = (
                sys.executable,
                "-m",
                "servemon",
                "ramp",
                "--config",
                str(config_file),
                "--shard",
                f"{i}/{n}",
                "--start-at",
                start,
                "--out",
                str(shard_dir),
                "--metrics-port",
                str(port),
                *headers,
            )
            log = (shard_dir / f"worker-{i}.log").open("w")
            procs.append(
                await asyncio.create_subprocess_exec(*argv, stdout=log, stderr=log)
            )
        console.print(
            f"servemon: {n} workers send the schedule together from {start} "
            f"(logs in {shard_dir})"
        )
        with _passing_signals_on(procs, console):
            codes = await asyncio.gather(*(p.wait() for p in procs))
    runs = sorted(p for p in shard_dir.iterdir() if p.is_dir())
    if len(runs) != n:
        raise ServemonError(
            f"--workers: {n - len(runs)} of {n} workers left no run directory "
            f"(exit codes {codes}; see {shard_dir}/worker-*.log)"
        )
    merged = merge_runs(runs, out)
    console.print(f"workers' exit codes: {codes}; merged run directory: {merged}")
    return merged
