"""A driver reads its own few settings, not the whole run's: each declares them as
a dataclass of :class:`~servemon.loadgen.run.config.LoadConfig`'s fields, and the run
fills them in (:func:`~servemon.loadgen.run.config.settings_of`)."""

from __future__ import annotations

import typing
from dataclasses import fields
from datetime import UTC, datetime

import pytest

from servemon.loadgen.run.config import Hold, LoadConfig, settings_of
from servemon.loadgen.run.context import Sending
from servemon.loadgen.runner import DRIVERS
from servemon.loadgen.send.arrivals import Shard

SETTINGS = sorted({d.settings for d in DRIVERS.values()} | {Sending}, key=str)


@pytest.mark.parametrize("kind", SETTINGS, ids=lambda k: k.__name__)
def test_every_setting_is_a_field_of_the_run_config_of_the_same_type(
    kind: type,
) -> None:
    config = typing.get_type_hints(LoadConfig)
    wrong = {
        name: (hint, config.get(name))
        for name, hint in typing.get_type_hints(kind).items()
        if config.get(name) != hint
    }
    assert not wrong, (
        f"{kind.__name__}: not LoadConfig's (name: its, config's): {wrong}"
    )


def test_the_settings_a_driver_gets_are_the_run_configs_values() -> None:
    config = LoadConfig(
        hold="kv_cache_usage=0.5",
        pace=True,
        rps_max=40.0,
        shard="1/3",
        start_at="2030-01-01T00:00:00Z",
        seed=7,
        late="skip",
    )
    control = settings_of(DRIVERS["control"].settings, config)
    assert isinstance(control.hold, Hold)
    assert (control.hold.signal, control.hold.setpoint) == ("kv_cache_usage", 0.5)
    assert (control.pace, control.rps_max, control.prometheus) == (True, 40.0, None)
    ramp = settings_of(DRIVERS["ramp"].settings, config)
    assert ramp.shard == Shard(1, 3)
    assert ramp.start_at == datetime(2030, 1, 1, tzinfo=UTC)
    assert settings_of(Sending, config) == Sending(7, 5.0, 1000, "skip", 1.0)
    # Each driver's settings are its own few, not the run's sixty.
    assert all(len(fields(k)) < len(fields(LoadConfig)) // 3 for k in SETTINGS)
