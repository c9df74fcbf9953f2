"""``--workers auto``: workers from the peak rate and the cost of a request."""

from __future__ import annotations

import pytest

from servemon.core.errors import ConfigError
from servemon.core.fields import load
from servemon.load import auto_workers
from servemon.loadgen.run.config import LoadConfig
from servemon.loadgen.run.flat import config_of
from servemon.loadgen.run.plan import make_plan
from servemon.loadgen.send.clientcost import CORE_BUDGET, request_cpu_s, workers_for


def test_more_chunks_and_higher_rates_need_more_workers_up_to_the_cpus() -> None:
    assert request_cpu_s(64) > request_cpu_s(8) > request_cpu_s(1) > 0
    low = workers_for(10, 64, cpus=8)
    assert (low.workers, low.needed) == (1, 1)
    per_worker = CORE_BUDGET / request_cpu_s(64)  # requests/s one worker sends
    two = workers_for(per_worker * 1.5, 64, cpus=8)
    assert two.workers == 2
    assert "--workers auto: 2 for a peak of" in two.explain()
    assert workers_for(per_worker * 1.5, 8, cpus=8).workers == 1  # cheaper
    capped = workers_for(per_worker * 20, 64, cpus=4)
    assert (capped.workers, capped.needed) == (4, 20)
    assert "20 needed but only 4 CPUs here" in capped.explain()


def test_auto_takes_the_peak_stage_and_the_workloads_output_budget() -> None:
    config = config_of(
        "ramp",
        (
            "flags",
            {
                "stages": "5:10,900:10,20:10",
                "workers": "auto",
                "workload": "random:prompt=16,output=256",
            },
        ),
    )
    choice = auto_workers(config, make_plan("ramp", config))
    assert choice.peak_rate == 900
    assert choice.cpu_per_request_s == request_cpu_s(256)
    flat = config_of(
        "ramp", ("flags", {"stages": "900:10", "workers": "auto", "stream": False})
    )
    unstreamed = auto_workers(flat, make_plan("ramp", flat))
    assert unstreamed.cpu_per_request_s == request_cpu_s(1)
    assert load(LoadConfig, {"workers": "3"}, "flags").workers == 3
    with pytest.raises(ConfigError, match=r"workers: .* or Input should be 'auto'"):
        load(LoadConfig, {"workers": "many"}, "flags")
