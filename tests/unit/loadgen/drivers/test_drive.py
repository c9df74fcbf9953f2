"""A driver reads its own settings, not the whole run's: its command's section of
:class:`~servemon.loadgen.run.config.LoadConfig` itself (``servemon control``'s
:class:`~servemon.loadgen.run.sections.ControlArgs`, a ramp's
:class:`~servemon.loadgen.run.sections.RampArgs`, ...), and two views of the flags the
commands share, filled by :func:`~servemon.loadgen.run.config.settings_of`."""

from __future__ import annotations

import typing
from dataclasses import fields
from datetime import UTC, datetime

import pytest

from servemon.core.errors import ConfigError
from servemon.loadgen.run.config import (
    SECTIONS,
    ControlArgs,
    Hold,
    LoadConfig,
    settings_of,
)
from servemon.loadgen.run.context import Sending, SignalSource
from servemon.loadgen.run.flat import config_of
from servemon.loadgen.runner import DRIVERS
from servemon.loadgen.send.arrivals import Shard

SETTINGS = sorted(
    {d.settings for d in DRIVERS.values()} | {Sending, SignalSource}, key=str
)
#: The settings that are a command's section, not copies of the config's fields.
OWN = set(SECTIONS.values())


@pytest.mark.parametrize("kind", SETTINGS, ids=lambda k: k.__name__)
def test_every_setting_is_a_field_of_the_run_config_of_the_same_type(
    kind: type,
) -> None:
    config = typing.get_type_hints(LoadConfig)
    if kind in OWN:  # a section: the config holds it whole
        (name,) = [n for n, s in SECTIONS.items() if s is kind]
        assert config[name] == kind | None
        return
    wrong = {
        name: (hint, config.get(name))
        for name, hint in typing.get_type_hints(kind).items()
        if config.get(name) != hint
    }
    assert not wrong, (
        f"{kind.__name__}: not LoadConfig's (name: its, config's): {wrong}"
    )


def test_the_settings_a_driver_gets_are_the_run_configs_values() -> None:
    config = config_of(
        "control",
        (
            "flags",
            {
                "hold": "kv_cache_usage=0.5",
                "pace": True,
                "rps_max": 40.0,
                "start_at": "2030-01-01T00:00:00Z",
                "seed": 7,
                "late": "skip",
                "drain": 2.0,
            },
        ),
    )
    control = settings_of(DRIVERS["control"].settings, config)
    assert control is config.control  # the section itself, not a copy
    assert isinstance(control, ControlArgs)
    assert isinstance(control.hold, Hold)
    assert (control.hold.signal, control.hold.setpoint) == ("kv_cache_usage", 0.5)
    assert control.pace is True
    start = datetime(2030, 1, 1, tzinfo=UTC)
    assert settings_of(Sending, config) == Sending(
        7, 5.0, 600.0, 1000, 2.0, "skip", 1.0, start, 40.0
    )
    # A ramp's driver gets its section, shard and all; no other command has one.
    ramp = config_of("ramp", ("flags", {"shard": "1/3", "stages": "2:5"}))
    section = settings_of(DRIVERS["ramp"].settings, ramp)
    assert section is ramp.ramp
    assert (section.shard, ramp.shard) == (Shard(1, 3), Shard(1, 3))
    assert config.shard is None
    with pytest.raises(ConfigError, match=r"^flags: --shard: only servemon ramp and"):
        config_of("control", ("flags", {"hold": "waiting=8", "shard": "1/3"}))
    assert settings_of(SignalSource, config) == SignalSource(None, 1.0, None, 30.0)
    # Each driver's settings are its own few, not the run's sixty.
    assert all(len(fields(k)) < len(fields(LoadConfig)) // 3 for k in SETTINGS)
