"""A capacity search's settings are checked before anything starts: a first step
that cannot fit in ``--max-duration`` is a one-line error, not a search that runs
no step and reports that no rate met the SLO."""

from __future__ import annotations

import pytest

from servemon.core.errors import ConfigError
from servemon.loadgen.run.config import CapacityArgs, LoadConfig
from servemon.loadgen.run.flat import config_of
from servemon.loadgen.run.plan import make_plan
from servemon.loadgen.run.sections import MIN_REQUESTS


def config(**changes: object) -> LoadConfig:
    base: dict[str, object] = {
        "slo": "ttft_p95<=0.5",
        "step_seconds": 3.0,
        "settle": 1.0,
    }
    return config_of("capacity", ("test", {**base, **changes}))


def test_a_low_rate_step_lasts_long_enough_for_its_judged_requests() -> None:
    c = config().capacity
    assert isinstance(c, CapacityArgs)
    assert c.step_at(100.0) == 3.0
    assert c.step_at(0.5) == 1.0 + MIN_REQUESTS / 0.5


def test_a_settle_as_long_as_the_step_is_refused_where_the_config_is_built() -> None:
    with pytest.raises(
        ConfigError, match=r"^--settle 3: must be shorter than the step$"
    ):
        config(settle=3.0)


def test_a_first_step_longer_than_max_duration_is_refused_before_the_run() -> None:
    with pytest.raises(ConfigError) as found:
        make_plan("capacity", config(max_duration=14.0))
    message = str(found.value)
    assert message.startswith("--max-duration 14: the first step")
    assert "--rps-min 0.5" in message
    assert "\n" not in message
    make_plan("capacity", config(max_duration=14.0, rps_min=2.0))  # 6 s: fits
