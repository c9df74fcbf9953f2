"""A walk from ``servemon ramp``'s flags to its driver, end to end through the CLI
and the built-in simulator: each input is parsed once where the config is built,
the run is planned once, and each file the command names is read once."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import pytest
from click.testing import CliRunner

from servemon.cli import cli
from servemon.core.signals import parse_selector
from servemon.core.slo import parse_slo
from servemon.core.wire.webconfig import load_web_config
from servemon.loadgen.run import choices
from servemon.loadgen.run import config as run_config
from servemon.loadgen.run import plan as run_plan
from servemon.loadgen.send import arrivals
from servemon.loadgen.workloads import modelmix, workload

pytestmark = pytest.mark.integration

#: The planning steps a command goes through, each to be entered once.
ONCE = {
    f.__code__: f.__qualname__
    for f in (
        run_plan.make_plan,
        workload.parse_workload,
        run_config.parse_hold,
        run_config.header_lines,
        arrivals.parse_stages,
        arrivals.parse_start_at,
        modelmix.parse_model,
        choices.parse_energy,
        choices.parse_model_choice,
        parse_slo,
        parse_selector,
        load_web_config,
    )
}


class Entered:
    """Calls of the planning steps, and the opens of the named files, on every
    thread while a command runs."""

    def __init__(self, files: list[Path]) -> None:
        #: Calls of each step, by what it was given (a default's parse is not a
        #: flag's).
        self.calls: Counter[tuple[str, str]] = Counter()
        self.opened: Counter[str] = Counter()
        self.files = {os.fspath(f) for f in files}
        self.on = False

    def profile(self, frame: FrameType, event: str, _arg: Any) -> None:
        code: CodeType = frame.f_code
        if event == "call" and code in ONCE:
            given = frame.f_locals.get(code.co_varnames[0])
            self.calls[ONCE[code], repr(given)] += 1

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if self.on and event == "open" and isinstance(args[0], str | Path):
            path = os.fspath(args[0])
            if path in self.files:
                self.opened[path] += 1

    def __enter__(self) -> Entered:
        self.on = True
        threading.setprofile(self.profile)
        sys.setprofile(self.profile)
        return self

    def __exit__(self, *_exc: object) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        self.on = False


@pytest.fixture(scope="module")
def watched() -> Iterator[list[Entered]]:
    """An audit hook cannot be removed: one for the module, which asks the
    watcher in force."""
    current: list[Entered] = []

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if current:
            current[-1].audit(event, args)

    sys.addaudithook(hook)
    yield current
    current.clear()


def test_a_ramp_parses_each_flag_plans_and_reads_each_file_once(
    tmp_path: Path, watched: list[Entered]
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"word {i} " * 8}) + "\n" for i in range(20))
    )
    headers = tmp_path / "headers.txt"
    headers.write_text("X-Team: load-tests\n")
    web = tmp_path / "web.yml"
    web.write_text("http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    settings = tmp_path / "servemon.yaml"
    settings.write_text(
        f"workload: file:{prompts},output=4\n"
        "slo: ttft_p95<=5\n"
        "stages: '4:1,8:1'\n"
        "energy: 'off'\n"
        f"header_file: {headers}\n"
        f"web_config_file: {web}\n"
    )
    args = [
        "ramp",
        "--config",
        str(settings),
        "--metrics-port",
        "0",
        "--sample-interval",
        "0.5",
        "--out",
        str(tmp_path / "runs"),
    ]
    entered = Entered([prompts, headers, settings, web])
    watched.append(entered)
    with entered:
        result = CliRunner().invoke(cli, args)
    watched.clear()
    assert result.exit_code == 0, result.output
    run = next((tmp_path / "runs").iterdir())
    assert (run / "summary.json").exists()
    sent = sum(s["sent"] for s in json.loads((run / "run.json").read_text())["stages"])
    assert sent > 0, "the walk reached the driver and it sent"

    # Each input parsed once (where the config was built), the plan made once.
    steps = Counter(name for name, _given in entered.calls)
    assert steps["make_plan"] == 1, entered.calls
    again = {key: n for key, n in entered.calls.items() if n > 1}
    assert not again, f"parsed again: {again}"
    parsed = ("parse_workload", "parse_stages", "parse_slo", "header_lines")
    for step in (*parsed, "parse_energy"):
        assert steps[step] >= 1, (step, entered.calls)
    assert steps["load_web_config"] == 1, entered.calls
    # And every file the command names read once.
    assert entered.opened == Counter({os.fspath(f): 1 for f in entered.files}), (
        entered.opened
    )
