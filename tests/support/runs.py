"""Load runs in tests: one in-process run as the CLI makes it, and its run directory
read back."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from rich.console import Console

from servemon.loadgen.record.line import timing_from_line
from servemon.loadgen.record.record import read_jsonl
from servemon.loadgen.record.runrecord import RunResult
from servemon.loadgen.run.config import Kind, LoadConfig
from servemon.loadgen.run.flat import config_of
from servemon.loadgen.run.plan import make_plan
from servemon.loadgen.run.progress import Progress
from servemon.loadgen.runner import Stopper, run_load
from servemon.loadgen.send.timing import RequestTiming

__all__ = ["SMALL", "config_for", "requests_of", "run"]

#: Short prompts and answers: the tiny simulator keeps up with hundreds a second.
SMALL = "random:prompt=16,output=4"


def config_for(
    server: Any, tmp_path: Path, kind: Kind = "ramp", **fields: Any
) -> LoadConfig:
    """A ``kind`` run against ``server`` with a free live-metrics port and bounded
    waits; ``fields`` flat, as ``--config`` writes them."""
    base: dict[str, Any] = {
        "target": server.url,
        "out": str(tmp_path / "runs"),
        "metrics_port": 0,
        "workload": SMALL,
        "timeout": 10.0,
        "grace": 1.0,
    }
    return config_of(kind, ("test", {**base, **fields}))


async def run(kind: str, config: LoadConfig, stop: Stopper | None = None) -> RunResult:
    """``run_load`` as ``servemon KIND`` calls it, its output kept quiet."""
    assert config.target is not None
    return await run_load(
        make_plan(kind, config),  # type: ignore[arg-type]
        config,
        config.target,
        argv=["servemon", kind, "(test)"],
        stop=Stopper() if stop is None else stop,
        env={},
        progress=Progress(Console(file=io.StringIO()), live=False),
    )


def requests_of(run_dir: Path, stage: int | None = None) -> list[RequestTiming]:
    """The finished requests ``run_dir/requests.jsonl`` holds (of one ``stage``)."""
    timings = [
        timing_from_line(line) for line in read_jsonl(run_dir / "requests.jsonl")
    ]
    return [t for t in timings if stage is None or t.stage == stage]
