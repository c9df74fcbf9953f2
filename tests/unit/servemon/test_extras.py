"""The base install runs the exporter; every other command names the extra it needs.

``servemon.cli.COMMANDS`` says where each command lives and which extra it needs,
``servemon.cli.EXTRAS`` which modules each extra brings; pyproject.toml declares the
same extras. A module of an extra is made missing here by a ``None`` in
``sys.modules``, which ``import`` and ``importlib.util.find_spec`` both honour; the
real missing install is tests/e2e/test_wheel.py's.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from servemon.cli import COMMANDS, EXTRAS, ServemonGroup, cli
from servemon.exits import ExitStatus

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def _declared(extra: str) -> set[str]:
    """The distributions pyproject.toml's ``extra`` brings, servemon's own extras
    (``servemon[loadgen]``) followed."""
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    found: set[str] = set()
    for requirement in extras[extra]:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement)
        assert name is not None, requirement
        if name[0] == "servemon":
            inner = re.search(r"\[([^\]]+)\]", requirement)
            assert inner is not None, requirement
            for each in inner[1].split(","):
                found |= _declared(each.strip())
        else:
            found.add(name[0].lower())
    return found


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_the_cli_knows_what_each_extra_of_pyproject_brings(extra: str) -> None:
    # Each distribution here installs the module of its own name.
    assert set(EXTRAS[extra]) == _declared(extra)


def test_all_and_dev_bring_every_extra() -> None:
    everything = set().union(*(_declared(extra) for extra in (*EXTRAS, "tokenizer")))
    assert everything <= _declared("all")
    assert _declared("all") <= _declared("dev")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_lives_where_the_table_says(name: str) -> None:
    command = cli.get_command(click.Context(cli), name)
    assert command is not None
    assert command.name == name
    assert COMMANDS[name].extra is None or COMMANDS[name].extra in EXTRAS


def _without(monkeypatch: pytest.MonkeyPatch, *modules: str) -> ServemonGroup:
    """A fresh group (no command loaded yet) where ``modules`` are not installed."""
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)
    return ServemonGroup(name="servemon")


@pytest.mark.parametrize("args", [["ramp", "--help"], ["ramp", "--rate", "2"]])
def test_a_command_without_its_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    group = _without(monkeypatch, "matplotlib", "scipy")
    done = CliRunner().invoke(group, args)
    assert done.exit_code == ExitStatus.USAGE
    assert done.output == (
        "servemon: error: servemon ramp needs the loadgen extra (no matplotlib): "
        "pip install 'servemon[loadgen]'\n"
    )


def test_the_base_commands_and_the_list_need_no_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = _without(monkeypatch, *{m for modules in EXTRAS.values() for m in modules})
    listing = CliRunner().invoke(group, ["--help"])
    assert listing.exit_code == 0, listing.output
    assert re.search(
        r"ramp +\(needs pip install 'servemon\[loadgen\]'\)", listing.output
    )
    assert re.search(
        r"compare +\(needs pip install 'servemon\[stats\]'\)", listing.output
    )
    for name in ("exporter", "sim", "rules"):
        assert COMMANDS[name].extra is None
        done = CliRunner().invoke(group, [name, "--help"])
        assert done.exit_code == 0, done.output
        assert "Usage: servemon" in done.output


def test_a_module_missing_while_a_command_runs_is_the_same_one_line() -> None:
    @click.command("report")
    def report() -> None:
        raise ModuleNotFoundError("No module named 'kiwisolver'", name="kiwisolver")

    group = ServemonGroup(name="servemon")
    group.add_command(report)
    done = CliRunner().invoke(group, ["report"])
    assert done.exit_code == ExitStatus.USAGE
    assert done.output == (
        "servemon: error: servemon report needs the loadgen extra (no kiwisolver): "
        "pip install 'servemon[loadgen]'\n"
    )


def test_a_missing_module_of_servemon_itself_stays_a_bug() -> None:
    @click.command("exporter")
    def exporter() -> None:
        raise ModuleNotFoundError("No module named 'yaml'", name="yaml")

    group = ServemonGroup(name="servemon")
    group.add_command(exporter)
    done = CliRunner().invoke(group, ["exporter"])
    assert isinstance(done.exception, ModuleNotFoundError)
