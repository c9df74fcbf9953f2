"""Every default ``--help`` shows has one home: the config dataclass of the command
(or, for a default decided later, the named constant the code uses)."""

from __future__ import annotations

import dataclasses
import re

import click
import pytest

from servemon.cli import cli
from servemon.commands.defaults import fill_defaults
from servemon.loadgen.run.config import ControlArgs, LoadConfig
from servemon.loadgen.run.plan import DEFAULT_STAGES
from servemon.monitor.config import ExporterConfig
from servemon.simulator.config import SimConfig

CONFIG = {
    "ramp": LoadConfig,
    "sweep": LoadConfig,
    "capacity": LoadConfig,
    "replay": LoadConfig,
    "control": (ControlArgs, LoadConfig),
    "sim": SimConfig,
    "exporter": ExporterConfig,
}


def _command(name: str) -> click.Command:
    command = cli.get_command(click.Context(cli), name)
    assert command is not None, name
    return command


def _declared(configs: type | tuple[type, ...], name: str) -> object:
    """The default of ``name`` as the command's config declares it (its own
    section first)."""
    fields = {
        f.name: f
        for config in reversed(configs if isinstance(configs, tuple) else (configs,))
        for f in dataclasses.fields(config)
    }
    field = fields.get(name)
    if field is None:
        return None
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None if field.default is dataclasses.MISSING else field.default


@pytest.mark.parametrize("command", list(CONFIG))
def test_help_shows_the_configs_default_once(command: str) -> None:
    checked = 0
    for param in _command(command).params:
        if not isinstance(param, click.Option):
            continue
        shown = re.findall(r"\[default: ([^\]]*)\]", param.help or "")
        assert len(shown) <= 1, (param.opts, param.help)
        value = _declared(CONFIG[command], param.name or "")
        if value is None or value == ():
            continue
        checked += 1
        assert shown, f"{param.opts[0]}: no default shown for {value!r}"
        if isinstance(value, float):
            assert float(shown[0]) == value, (param.opts, shown)
        elif isinstance(value, str | int) and not isinstance(value, bool):
            assert shown[0] == str(value), (param.opts, shown)
    assert checked >= 5


def test_a_help_that_copies_a_configs_default_is_refused() -> None:
    @click.command()
    @click.option("--timeout", type=float, help="Seconds. [default: 600]")
    def copied(timeout: float | None) -> None:
        del timeout

    with pytest.raises(ValueError, match=r"LoadConfig\.timeout"):
        fill_defaults(copied, LoadConfig)


def test_a_default_decided_later_names_its_constant() -> None:
    (stages,) = [p for p in _command("ramp").params if p.name == "stages"]
    assert f"[default: {DEFAULT_STAGES}]" in (stages.help or "")
