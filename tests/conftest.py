"""Shared fixtures: a simulator on a free loopback port, polling, scraping, SSE.

Helpers are handed out as fixtures (``start_sim``, ``poll_until``, ``scrape``,
``read_sse``, ``margin``) so test modules never import this file.

Hypothesis profiles: ``ci`` (the default) runs a small, fixed number of examples
per property, derandomized so that every run draws the same ones; ``long``
(``--hypothesis-profile=long``) draws many more, randomly, for a nightly-style
hunt. A test that asks for a budget of its own keeps it under both.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from hypothesis import settings
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from servemon.simulator.config import SimConfig, merge
from servemon.simulator.server import SimServer
from tests.support import oneroot
from tests.support.margins import Margin

#: A bare part name (``import monitor``) is refused in the test process: it would load
#: a second copy of each module (tests/support/oneroot.py).
oneroot.install()

settings.register_profile(
    "ci", max_examples=40, deadline=None, derandomize=True, database=None
)
settings.register_profile("long", max_examples=2_000, deadline=None)
# Loaded here, before pytest's configure hook: Hypothesis's --hypothesis-profile,
# when given, is applied after it and wins.
settings.load_profile("ci")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` as ``scripts/test`` runs the rest of the suite on five
    workers: each module one group, the real engines one, the longest sent first
    (tests/support/groups.py; xdist's own reading of groups is lost under pytest 9).
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests.support.groups import GroupScheduling

    return GroupScheduling(config, log)


#: The base every test simulator starts from: the fast profile on a free port.
BASE_CONFIG = SimConfig(host="127.0.0.1", port=0, profile="tiny")

#: Explicit client limits (aiohttp's defaults would hide a hung test for 5 minutes).
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=20, sock_connect=2)


@contextlib.asynccontextmanager
async def _running_sim(**overrides: Any) -> AsyncIterator[SimServer]:
    config = merge(BASE_CONFIG, overrides, "test")
    async with SimServer(config) as server:
        yield server


@pytest.fixture
def start_sim() -> Callable[..., contextlib.AbstractAsyncContextManager[SimServer]]:
    """``async with start_sim(max_num_seqs=4, faults={...}) as server:``.

    Overrides are SimConfig fields (``faults`` as a mapping), applied to the tiny
    profile on 127.0.0.1 port 0; the server is stopped on leaving the block.
    """
    return _running_sim


@pytest.fixture
def margin(request: pytest.FixtureRequest) -> Margin:
    """``margin(name, figure, low=..., below=...)``: holds a timing or a share to
    its bound and records both in the JUnit XML, where ``scripts/margins`` reads
    them (tests/support/margins.py)."""
    return Margin(request.node)


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A client session with explicit limits and timeouts; closed afterwards."""
    connector = aiohttp.TCPConnector(limit=64, force_close=False)
    async with aiohttp.ClientSession(
        connector=connector, timeout=CLIENT_TIMEOUT, trust_env=False
    ) as session:
        yield session


async def _poll_until(
    predicate: Callable[[], Awaitable[Any] | Any],
    timeout: float,  # noqa: ASYNC109 (a deadline that fails the test with a message)
    interval: float = 0.005,
    what: str = "condition",
) -> Any:
    """Call ``predicate`` until it returns something truthy; return that value.

    Fails the test if ``timeout`` seconds pass first. ``predicate`` may be sync or
    async.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        last = result
        if time.monotonic() >= deadline:
            pytest.fail(f"{what} not reached within {timeout} s (last: {last!r})")
        await asyncio.sleep(interval)


@pytest.fixture
def poll_until() -> Callable[..., Awaitable[Any]]:
    """``await poll_until(predicate, timeout)``: poll with a deadline."""
    return _poll_until


SampleKey = tuple[str, frozenset[tuple[str, str]]]


@dataclass(frozen=True, slots=True)
class Scrape:
    """One parsed ``/metrics`` exposition."""

    text: str
    samples: dict[SampleKey, float]
    types: dict[str, str]

    def get(self, name: str, **labels: str) -> float:
        """Sum of the samples called ``name`` whose labels include ``labels``.

        Fails the test if there is no such sample.
        """
        wanted = set(labels.items())
        found = [
            value
            for (sample, have), value in self.samples.items()
            if sample == name and wanted <= have
        ]
        if not found:
            pytest.fail(f"no sample {name}{labels or ''} in /metrics")
        return sum(found)

    def labels_of(self, name: str) -> list[dict[str, str]]:
        """The label sets of every sample called ``name``."""
        return [dict(have) for (sample, have) in self.samples if sample == name]


def parse_metrics(text: str) -> Scrape:
    """Parse an exposition with prometheus_client's parser."""
    samples: dict[SampleKey, float] = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        sample: Sample
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return Scrape(text=text, samples=samples, types=types)


async def _scrape(session: aiohttp.ClientSession, base_url: str) -> Scrape:
    async with session.get(f"{base_url}/metrics") as resp:
        assert resp.status == 200, await resp.text()
        return parse_metrics(await resp.text())


@pytest.fixture
def scrape() -> Callable[[aiohttp.ClientSession, str], Awaitable[Scrape]]:
    """``await scrape(session, server.url)`` → :class:`Scrape`."""
    return _scrape


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One ``data:`` line of a server-sent event stream and when it arrived."""

    data: str
    at: float

    def json(self) -> Any:
        """The payload decoded as JSON."""
        return json.loads(self.data)


@dataclass(frozen=True, slots=True)
class SseStream:
    """What a client read from a stream: the events and how the stream ended."""

    events: list[SseEvent]
    done: bool
    error: BaseException | None

    def chunks(self) -> list[dict[str, Any]]:
        """The JSON payloads before ``[DONE]``."""
        return [e.json() for e in self.events if e.data != "[DONE]"]


async def _read_sse(
    resp: aiohttp.ClientResponse, max_events: int = 10_000
) -> SseStream:
    """Read ``data:`` lines until ``[DONE]``, EOF or a payload error."""
    events: list[SseEvent] = []
    done = False
    error: BaseException | None = None
    try:
        async for raw in resp.content:
            line = raw.decode().rstrip("\r\n")
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            events.append(SseEvent(data=data, at=time.monotonic()))
            if data == "[DONE]":
                done = True
                break
            assert len(events) < max_events, "runaway stream"
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as exc:
        error = exc
    return SseStream(events=events, done=done, error=error)


@pytest.fixture
def read_sse() -> Callable[..., Awaitable[SseStream]]:
    """``await read_sse(resp)`` → :class:`SseStream`."""
    return _read_sse


def words(n: int, offset: int = 0) -> str:
    """``n`` distinct whitespace-separated words (``n`` tokens), from ``offset``."""
    return " ".join(f"w{i}" for i in range(offset, offset + n))


@pytest.fixture
def make_prompt() -> Callable[..., str]:
    """``make_prompt(n, offset=0)``: a prompt of exactly ``n`` tokens."""
    return words


def chat_body(content: str, **extra: Any) -> dict[str, Any]:
    """A chat completion request body with one user message."""
    return {"messages": [{"role": "user", "content": content}], **extra}


@pytest.fixture
def chat() -> Callable[..., dict[str, Any]]:
    """``chat(content, **fields)``: a chat completion request body."""
    return chat_body


def content_of(chunks: Iterable[dict[str, Any]]) -> list[str]:
    """The content pieces of chat or completion chunks, in order (empty skipped)."""
    pieces: list[str] = []
    for chunk in chunks:
        for choice in chunk.get("choices", []):
            text = choice.get("text")
            if text is None:
                text = choice.get("delta", {}).get("content")
            if text:
                pieces.append(text)
    return pieces


@pytest.fixture
def contents() -> Callable[[Iterable[dict[str, Any]]], list[str]]:
    """``contents(chunks)``: the non-empty content pieces of stream chunks."""
    return content_of
