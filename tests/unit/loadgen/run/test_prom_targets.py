"""loadgen.run.promtargets: the scrape interval behind ``--select``, asked of a
stand-in for Prometheus' HTTP API over a real socket (the answers shaped as
Prometheus 2.42 gives them); whatever it cannot say falls back to 15 s with the
reason, and no read is unbounded."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from servemon.embedded import free_port
from servemon.loadgen.run.promtargets import ScrapeInterval, find_scrape_interval


def _target(job: str, instance: str, interval: str | None, **labels: str) -> Any:
    target: dict[str, Any] = {
        "labels": {"job": job, "instance": instance, **labels},
        "scrapePool": job,
        "health": "up",
    }
    if interval is not None:
        target["scrapeInterval"] = interval
        target["scrapeTimeout"] = "1s"
    return target


@dataclass
class FakePrometheus:
    """``/api/v1/query`` answers the (job, instance) pairs of ``series``;
    ``/api/v1/targets`` the ``targets``."""

    series: list[tuple[str, str]] = field(default_factory=list)
    targets: list[Any] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)
    auth: list[str] = field(default_factory=list)
    #: Seconds to wait before answering the targets (a hung Prometheus).
    stall_s: float = 0.0
    #: Bytes of padding in the targets' answer.
    padding: int = 0

    async def query(self, request: web.Request) -> web.Response:
        self.queries.append(request.query["query"])
        self.auth.append(request.headers.get("Authorization", ""))
        result = [
            {"metric": {"job": job, "instance": instance}, "value": [0, "1"]}
            for job, instance in self.series
        ]
        return web.json_response(
            {"status": "success", "data": {"resultType": "vector", "result": result}}
        )

    async def active(self, request: web.Request) -> web.Response:
        assert request.query["state"] == "active"
        await asyncio.sleep(self.stall_s)
        data = {"activeTargets": self.targets, "droppedTargets": []}
        return web.json_response(
            {"status": "success", "data": data, "padding": "x" * self.padding}
        )


def _ask(
    fake: FakePrometheus, matchers: tuple[str, ...] = (), **limits: Any
) -> ScrapeInterval:
    async def go() -> ScrapeInterval:
        app = web.Application()
        app.router.add_get("/api/v1/query", fake.query)
        app.router.add_get("/api/v1/targets", fake.active)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        try:
            async with aiohttp.ClientSession() as session:
                return await find_scrape_interval(
                    session,
                    f"http://127.0.0.1:{runner.addresses[0][1]}/",
                    matchers,
                    {"Authorization": "Bearer s3cret"},
                    **limits,
                )
        finally:
            await runner.cleanup()

    return asyncio.run(asyncio.wait_for(go(), 30))


TARGETS = [
    _target("servemon", "10.0.0.1:9400", "1s", pool="a"),
    _target("servemon", "10.0.0.2:9400", "5s", pool="b"),
    _target("node", "10.0.0.1:9100", "1m"),
]


def test_the_largest_interval_of_the_targets_exposing_the_selected_series() -> None:
    fake = FakePrometheus(
        series=[("servemon", "10.0.0.1:9400"), ("servemon", "10.0.0.2:9400")],
        targets=TARGETS,
    )
    found = _ask(fake, ('target="sim-a"',))
    assert found == ScrapeInterval(
        5.0,
        "prometheus",
        "series",
        (("servemon/10.0.0.1:9400", 1.0), ("servemon/10.0.0.2:9400", 5.0)),
    )
    # The series were picked by the selector, grouped by the scrape's labels.
    (query,) = fake.queries
    assert 'target="sim-a"' in query
    assert "by (job, instance)" in query
    assert set(fake.auth) == {"Bearer s3cret"}
    assert found.record().targets == {
        "servemon/10.0.0.1:9400": 1.0,
        "servemon/10.0.0.2:9400": 5.0,
    }


def test_without_series_the_targets_labels_are_matched() -> None:
    """No servemon series yet: a matcher on a label the target carries picks it,
    one on a label it does not carry (``target``, the series') is no bar."""
    fake = FakePrometheus(targets=TARGETS)
    found = _ask(fake, ('pool=~"a|c"', 'target="sim-a"'))
    assert found.seconds == 1.0
    assert found.matched_by == "labels"
    assert found.targets == (("servemon/10.0.0.1:9400", 1.0),)
    assert _ask(fake, ('job!="node"',)).seconds == 5.0
    assert _ask(fake).seconds == 60.0  # no selector: every target


def test_what_prometheus_cannot_say_is_the_default_with_its_reason() -> None:
    none = _ask(FakePrometheus(targets=[]))
    assert (none.seconds, none.source) == (15.0, "default")
    assert none.why == "Prometheus: no active target"
    unmatched = _ask(FakePrometheus(targets=TARGETS), ('job="vllm"',))
    assert unmatched.why == "Prometheus: no active target matches"
    old = _ask(FakePrometheus(targets=[_target("servemon", "h:1", None)]))
    assert old.seconds == 15.0
    assert old.why == "Prometheus: no scrapeInterval in target servemon/h:1"


def test_every_read_is_bounded_in_time_and_size() -> None:
    hung = _ask(FakePrometheus(targets=TARGETS, stall_s=5.0), timeout_s=0.5)
    assert hung.source == "default"
    assert hung.why == "Prometheus: no answer within 0.5 s"
    huge = _ask(FakePrometheus(targets=TARGETS, padding=50_000), max_bytes=10_000)
    assert huge.source == "default"
    assert huge.why is not None
    assert "over 10000" in huge.why


def test_a_prometheus_that_is_down_gives_the_default() -> None:
    async def go() -> ScrapeInterval:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
            return await find_scrape_interval(session, url, ())

    found = asyncio.run(asyncio.wait_for(go(), 30))
    assert found.source == "default"
    assert found.why is not None
    assert found.why.startswith("Prometheus: ClientConnectorError")
