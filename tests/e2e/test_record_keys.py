"""``run.json`` as a user's ``jq`` line reads it: the same command writes the same
keys as the servemon before its sections were typed (``tests/data/records-v1``),
and those added since (``ADDED``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.records import ADDED, COMMANDS, RECORDS, key_paths

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_new_run_json_has_the_keys_of_the_previous_servemons(
    servemon: Callable[..., Any], tmp_path: Path, name: str
) -> None:
    out = tmp_path / "runs"
    cli = servemon(
        *COMMANDS[name],
        "--sim-profile",
        "tiny",
        "--metrics-port",
        "0",
        "--out",
        str(out),
    )
    assert cli.wait(90) == 0, cli.stderr
    (run_dir,) = out.iterdir()
    new = json.loads((run_dir / "run.json").read_text())
    old = json.loads((RECORDS / name / "run.json").read_text())
    assert key_paths(new) == key_paths(old) | ADDED
    assert list(new) == list(old)
