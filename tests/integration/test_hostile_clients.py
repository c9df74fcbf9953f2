"""Every HTTP client servemon has, against a hostile server
(:mod:`tests.support.hostile`: gzip bombs of 2 GiB, header floods, an endless
stream, a slow drip), over real sockets: each ends with an error that names the
bound it hit (core/wire/limits.py), or with its deadline, and nothing raises out of
it. The load generator's memory and schedule under the same answers are in
``e2e/test_hostile_server.py``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from servemon.core.errors import TargetError
from servemon.core.signals import queries
from servemon.core.wire.limits import ResponseLimits, session_options
from servemon.loadgen.run.promsource import PrometheusSampler
from servemon.loadgen.run.sampler import ServerSampler
from servemon.loadgen.run.target import discover_model, target_version
from servemon.loadgen.send.client import ClientSettings, make_session, send_request
from servemon.loadgen.send.timing import Outcome
from servemon.loadgen.workloads.tokens import (
    EstimateCounter,
    ServerTokenizer,
    pick_counter,
)
from servemon.monitor.engine import EngineCollector, Target
from servemon.monitor.probe import Prober
from tests.support.hostile import MODEL, hostile_target

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

BODY_BOUND = "a response body over 16 MiB (gzip: "


@pytest_asyncio.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with make_session(ClientSettings()) as s:
        yield s


def chat(stream: bool) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
    }


@pytest.mark.parametrize(
    ("kind", "stream", "outcome", "error"),
    [
        ("bomb", False, Outcome.RESPONSE_TOO_LARGE, "a response body over 4 MiB"),
        ("bomb", True, Outcome.RESPONSE_TOO_LARGE, "an SSE line over 1 MiB"),
        ("sse_bomb", True, Outcome.RESPONSE_TOO_LARGE, "an SSE line over 1 MiB"),
        ("header_flood", True, Outcome.RESPONSE_TOO_LARGE, "Too many headers"),
        ("huge_header", False, Outcome.RESPONSE_TOO_LARGE, "Got more than 8190"),
        ("endless", True, Outcome.TIMEOUT, "no complete answer within 1 s"),
        ("drip", True, Outcome.TIMEOUT, "no complete answer within 1 s"),
        ("ok", True, Outcome.OK, None),
    ],
)
async def test_a_request_ends_as_an_error_naming_why(
    session: aiohttp.ClientSession,
    kind: str,
    stream: bool,
    outcome: Outcome,
    error: str | None,
) -> None:
    with hostile_target([kind]) as url:
        timing = await send_request(
            session,
            url + "/v1/chat/completions",
            chat(stream),
            request_id=kind,
            timeout_s=1.0,
        )
    assert timing.outcome is outcome, timing.error
    if error is None:
        assert timing.error is None
    else:
        assert timing.error is not None
        assert error in timing.error


async def test_a_fast_endless_stream_ends_at_the_stream_bound(
    session: aiohttp.ClientSession,
) -> None:
    # The deadline is far; the stream's byte budget ends it first.
    with hostile_target(["endless"]) as url:
        timing = await send_request(
            session,
            url + "/v1/chat/completions",
            chat(True),
            request_id="endless",
            timeout_s=60.0,
            limits=ResponseLimits(stream_bytes=4096),
        )
    assert timing.outcome is Outcome.RESPONSE_TOO_LARGE, timing.error
    assert timing.error is not None
    assert timing.error.startswith("an SSE stream over 4096 bytes mid-answer")
    assert timing.e2e < 10


async def test_model_discovery_and_the_version_refuse_a_bomb(
    session: aiohttp.ClientSession,
) -> None:
    with hostile_target(bombed_models=True) as url:
        with pytest.raises(TargetError) as caught:
            await discover_model(session, url, None)
        assert await target_version(session, url) is None
    assert str(caught.value).startswith(f"{url}/v1/models: {BODY_BOUND}")


async def test_the_tokenize_counter_refuses_a_bomb(
    session: aiohttp.ClientSession,
) -> None:
    with hostile_target() as url:
        with pytest.raises(TargetError) as caught:
            await ServerTokenizer(session, url, MODEL).count("hello")
        # A run goes on with the estimate, as for any /tokenize that fails.
        counter = await pick_counter(session, url, MODEL, None)
    assert BODY_BOUND in str(caught.value)
    assert isinstance(counter, EstimateCounter)


async def test_the_samplers_record_a_bomb_as_an_error_line(
    session: aiohttp.ClientSession,
) -> None:
    lines: list[Any] = []
    with hostile_target() as url:
        direct = ServerSampler(session, url + "/metrics", lines.append)
        assert await direct.sample_once() is None
        prometheus = PrometheusSampler(
            session, url, queries((), 60), lines.append, timeout_s=10
        )
        assert await prometheus.sample_once() is None
    direct_line, prometheus_line = lines
    assert BODY_BOUND in direct_line["error"], direct_line
    assert prometheus_line["error"].startswith(f"Prometheus: {BODY_BOUND}")


async def test_the_probe_and_the_exporters_scrape_refuse_bombs_and_floods() -> None:
    async with aiohttp.ClientSession(**session_options()) as session:
        with hostile_target(["sse_bomb", "header_flood"], bombed_models=True) as url:
            target = Target(url=url, name="hostile")
            engine = EngineCollector([target], session, timeout_s=10)
            prober = Prober([target], session, lambda t: None, interval_s=60)
            outcomes = [await prober.probe(target) for _ in range(2)]
            scrape = await engine.collect()
            await engine.close()
    assert outcomes == ["response_too_large", "response_too_large"]
    up = [s.value for f in scrape.targets for s in f.samples if s.name.endswith("_up")]
    assert up == [0.0]
    assert engine.last_error["hostile"].startswith(
        "too_large: a response body over 8 MiB (gzip: "
    )
