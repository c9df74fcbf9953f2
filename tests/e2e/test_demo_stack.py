"""Every dashboard panel has data from the simulator as ``servemon demo`` starts it.

The demo's simulator (its profile and flags, :func:`servemon.demo.simulator_args`:
vLLM 0.34's metric names, the MFU estimates on) behind ``servemon exporter`` (a fake
GPU, a canary probe each second), Debian's ``prometheus`` scraping it and a ``servemon
ramp``'s live client metrics every second with the generated SLO rules, and a load
whose prompts share prefixes, so that every counter moves, the prefix cache's
included. Then every PromQL expression of every generated dashboard panel returns
data, but for the series no simulator run of the demo has (named, with why, in
:data:`NOT_IN_THE_DEMO`), and the cached prompt tokens the overview draws are
more than zero.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from servemon.dashboards.rules import load_slo_config, write_rules
from servemon.demo import simulator_args
from servemon.embedded import free_port
from tests.e2e.test_alerting_stack import (
    LOADGEN_SLO,
    PROMETHEUS,
    READY_EXPORTER,
    slo_file,
)
from tests.support.alerting import PrometheusApi, prometheus_argv, prometheus_file
from tests.support.dashboards import until_every_panel_has_data
from tests.support.processes import (
    READY_SIM,
    SERVEMON,
    Child,
    logs,
    ready_url,
    servemon_argv,
    spawn,
    stop,
    until,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(PROMETHEUS is None, reason="needs Debian's prometheus"),
    pytest.mark.timeout(240),
]

#: ``servemon demo``'s defaults (its command's options).
DEMO_PROFILE = "qwen3-0.6b-eager"
DEMO_MAX_NUM_SEQS = 16
#: A load the demo's simulator keeps up with, half of each prompt from the prefix
#: cache.
LOAD = ("--stages", "4:600", "--workload", "prefix:hit=0.5,prompt=256,output=16")

#: Series the demo's simulator does not have, and why: their panels are checked for
#: being valid PromQL, not for data.
NOT_IN_THE_DEMO = {
    "servemon_client_control_": "only a servemon control run serves them",
    "servemon_engine_lora_": "the demo serves no LoRA adapter",
    "servemon_engine_prefix_cache_hit_ratio": "vLLM V0's gauge; V1 has counters",
}


@dataclass
class Stack:
    http: aiohttp.ClientSession
    prometheus: str
    children: list[Child]

    def alive(self) -> None:
        for child in self.children:
            child.alive()

    async def query(self, promql: str) -> list[dict[str, Any]]:
        return await PrometheusApi(self.http, self.prometheus).query(promql)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    assert PROMETHEUS is not None
    tmp = tmp_path_factory.mktemp("demo-stack")
    children: list[Child] = []
    async with contextlib.AsyncExitStack() as exits:
        timeout = aiohttp.ClientTimeout(total=10, sock_connect=2)
        http = await exits.enter_async_context(
            aiohttp.ClientSession(timeout=timeout, trust_env=False)
        )

        async def started(name: str, argv: Sequence[str], **how: Any) -> Child:
            child = await spawn(name, argv, tmp)
            children.append(child)
            exits.push_async_callback(stop, child, **how)
            return child

        async def bring_up() -> Stack:
            sim_child = await started(
                "sim",
                servemon_argv(
                    "sim",
                    *("--host", "127.0.0.1", "--port", "0"),
                    *("--profile", DEMO_PROFILE),
                    *simulator_args(DEMO_MAX_NUM_SEQS, seed=0),
                ),
            )
            sim = await ready_url(sim_child, READY_SIM, 30)
            exporter_child = await started(
                "exporter",
                servemon_argv(
                    "exporter",
                    *("--target", f"sim={sim}"),
                    *("--listen", "127.0.0.1:0", "--fake-gpu", "--probe-interval", "1"),
                ),
            )
            exporter = await ready_url(exporter_child, READY_EXPORTER, 30)
            rules = write_rules(
                load_slo_config(slo_file(tmp / "slos.yaml")), tmp / "rules"
            )
            prom_port, loadgen_port = free_port(), free_port()
            config = prometheus_file(
                tmp / "prometheus.yml",
                rules=rules,
                jobs={
                    "servemon-exporter": [exporter.removeprefix("http://")],
                    "servemon-loadgen": [f"127.0.0.1:{loadgen_port}"],
                },
            )
            await started(
                "prometheus",
                prometheus_argv(PROMETHEUS, config, tmp, prom_port),
            )
            stack = Stack(http, f"http://127.0.0.1:{prom_port}", children)

            async def ready() -> bool:
                stack.alive()
                return await PrometheusApi(http, stack.prometheus).ready()

            await until(ready, 30, "prometheus /-/ready")
            await started(
                "ramp",
                [
                    *SERVEMON,
                    "ramp",
                    *("--target", sim, "--target-name", "sim"),
                    *("--metrics-port", str(loadgen_port), "--slo", LOADGEN_SLO),
                    *("--out", str(tmp / "runs")),
                    *LOAD,
                ],
                sig=signal.SIGINT,
                timeout_s=30,
            )

            async def flowing() -> bool:
                stack.alive()
                client = await stack.query("sum(servemon_client_requests_total) > 0")
                engine = await stack.query(
                    "servemon_engine_requests_finished_total > 0"
                )
                return bool(client and engine)

            await until(flowing, 60, "client and engine series in Prometheus")
            return stack

        try:
            stack = await bring_up()
        except BaseException:
            sys.stderr.write(logs(children))
            raise
        yield stack


@pytest.mark.asyncio(loop_scope="module")
async def test_every_dashboard_query_returns_data_from_the_demos_simulator(
    stack: Stack,
) -> None:
    empty = await until_every_panel_has_data(stack.query, stack.alive, NOT_IN_THE_DEMO)
    assert not empty, f"{len(empty)} dashboard queries return no data:\n" + "\n".join(
        empty
    )


@pytest.mark.asyncio(loop_scope="module")
async def test_the_prefix_cache_saves_prompt_tokens_in_prometheus(
    stack: Stack,
) -> None:
    async def saved() -> bool:
        stack.alive()
        by_source = await stack.query(
            "rate(servemon_engine_prompt_tokens_by_source_total"
            '{source="local_cache_hit"}[30s]) > 0'
        )
        cached = await stack.query(
            "rate(servemon_engine_prompt_tokens_cached_total[30s]) > 0"
        )
        return bool(by_source and cached)

    await until(saved, 60, "cached prompt tokens in Prometheus")
