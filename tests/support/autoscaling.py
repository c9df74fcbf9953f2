"""A fleet that scales, for end-to-end tests of ``servemon autoscale``'s settings.

- :class:`HorizontalRule` is Kubernetes' HorizontalPodAutoscaler for one External
  metric with a ``Value`` target, as its documentation states the algorithm:
  ``desired = ceil(ready pods x value / target)``, no change while
  ``|value / target - 1| <= tolerance`` (0.1), scale-up at once (stabilization 0),
  scale-down to the highest recommendation of the last ``scale_down_window_s``
  seconds, then bounded by the least and most replicas. Its default rate policies
  (up: 4 pods or 100 % per 15 s, down: 100 % per 15 s) never bind at 4 replicas
  or fewer, so they are left out. A missing metric changes nothing.
- :class:`ScaledFleet` owns the replicas (``servemon sim`` processes) behind nginx:
  a replica joins nginx's upstreams and Prometheus' file_sd targets once it serves,
  and leaves both before it is stopped.
- :class:`StandbyFleet` is the same for servers started ahead of time (a real vLLM
  takes minutes to start on a CPU): scaling up routes to the next one at once,
  scaling down takes it out of the routes and leaves it running.
- :class:`Scaler` ticks: reads the scalers' query from Prometheus, asks the rule,
  scales the fleet and appends the decision to a JSON-lines file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import aiohttp

from tests.support.alerting import PrometheusApi
from tests.support.nginx import nginx_file
from tests.support.processes import READY_SIM, Child, ready_url, stop

__all__ = [
    "Decision",
    "HorizontalRule",
    "Replica",
    "ScaledFleet",
    "Scaler",
    "StandbyFleet",
    "read_decisions",
    "write_targets",
]


@dataclass(frozen=True, slots=True)
class Decision:
    """One tick of the scaler, as ``scaler.jsonl`` records it."""

    #: When (this machine's monotonic clock, which run.json's clock origin shares).
    mono_s: float
    #: The metric read; None: Prometheus had no value (nothing changes then).
    value: float | None
    target: float
    #: Replicas asked for before this tick, and those serving.
    current: int
    ready: int
    #: The rule's own recommendation (before stabilization and bounds).
    recommended: int | None
    desired: int


@dataclass
class HorizontalRule:
    """Kubernetes' HPA arithmetic for one External metric of target type Value."""

    target: float
    max_replicas: int
    scale_down_window_s: float
    min_replicas: int = 1
    tolerance: float = 0.1
    #: (time, recommendation) of the last scale_down_window_s seconds.
    recommendations: list[tuple[float, int]] = field(default_factory=list)

    def decide(
        self, now: float, value: float | None, current: int, ready: int
    ) -> Decision:
        """The replicas wanted at ``now`` given the metric's ``value``."""
        if value is None:
            return Decision(now, None, self.target, current, ready, None, current)
        ratio = value / self.target
        if abs(ratio - 1) <= self.tolerance:
            recommended = current
        else:
            recommended = math.ceil(ratio * ready)
        cutoff = now - self.scale_down_window_s
        self.recommendations = [(t, r) for t, r in self.recommendations if t > cutoff]
        self.recommendations.append((now, recommended))
        # Scale-up stabilization 0: up to the recommendation at once; down only to
        # the highest recommendation within the window.
        highest = max(r for _t, r in self.recommendations)
        desired = max(current, recommended)
        desired = min(desired, highest)
        desired = max(self.min_replicas, min(self.max_replicas, desired))
        return Decision(now, value, self.target, current, ready, recommended, desired)


@dataclass
class Replica:
    """One replica: its process, and its address once it serves."""

    name: str
    child: Child
    #: host:port once it serves.
    address: str | None = None


@dataclass
class ScaledFleet:
    """Replicas behind nginx, scraped by Prometheus through a file_sd file."""

    folder: Path
    nginx: Child
    nginx_port: int
    sd_file: Path
    #: Starts a replica's process (stopped with the test's stack).
    start: Callable[[str], Awaitable[Child]]
    replicas: list[Replica] = field(default_factory=list)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _count: int = 0

    @property
    def current(self) -> int:
        return len(self.replicas)

    @property
    def ready(self) -> int:
        return sum(r.address is not None for r in self.replicas)

    def alive(self) -> None:
        """Fail if nginx, a replica, or a replica's start or stop failed."""
        self.nginx.alive()
        for replica in self.replicas:
            replica.child.alive()
        for task in [t for t in self._tasks if t.done()]:
            self._tasks.discard(task)
            task.result()

    async def scale_to(self, count: int) -> None:
        """Start replicas (they join once they serve) or take the newest out."""
        while self.current < count:
            self._count += 1
            name = f"sim-{self._count}"
            replica = Replica(name, await self.start(name))
            self.replicas.append(replica)
            self._background(self._join(replica))
        while self.current > count:
            replica = self.replicas.pop()
            if replica.address is not None:
                self._route()
            self._background(self._leave(replica))

    async def settled(self) -> None:
        """Wait for every replica started or stopped to have joined or gone."""
        while self._tasks:
            await asyncio.gather(*self._tasks)
            self.alive()

    def _background(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)

    async def _join(self, replica: Replica) -> None:
        url = await ready_url(replica.child, READY_SIM, 60)
        if replica in self.replicas:
            replica.address = url.removeprefix("http://")
            self._route()

    async def _leave(self, replica: Replica) -> None:
        """Stop a replica once nginx's old worker has finished its requests."""
        if replica.address is not None:
            for _ in range(50):  # 10 s at most
                if not await _busy(replica.address):
                    break
                await asyncio.sleep(0.2)
        await stop(replica.child)

    def _route(self) -> None:
        """Write nginx's upstreams and the file_sd targets: the serving replicas."""
        addresses = [r.address for r in self.replicas if r.address is not None]
        nginx_file(
            self.folder, f"127.0.0.1:{self.nginx_port}", [(a, 1) for a in addresses]
        )
        write_targets(self.sd_file, addresses)
        self.nginx.proc.send_signal(signal.SIGHUP)


class Fleet(Protocol):
    """What a :class:`Scaler` scales."""

    @property
    def current(self) -> int: ...

    @property
    def ready(self) -> int: ...

    def alive(self) -> None: ...

    async def scale_to(self, count: int) -> None: ...


@dataclass
class StandbyFleet:
    """Servers already serving (``addresses``, host:port) behind nginx, the first
    routed from the start and each next one routed when the count asks for it."""

    folder: Path
    nginx: Child
    nginx_port: int
    sd_file: Path
    addresses: Sequence[str]
    #: Fails if a server has died (their processes are the caller's).
    check: Callable[[], None]
    routed: int = 1

    @property
    def current(self) -> int:
        return self.routed

    @property
    def ready(self) -> int:
        return self.routed

    def alive(self) -> None:
        self.nginx.alive()
        self.check()

    async def scale_to(self, count: int) -> None:
        count = max(1, min(count, len(self.addresses)))
        if count != self.routed:
            self.routed = count
            chosen = list(self.addresses[:count])
            nginx_file(
                self.folder, f"127.0.0.1:{self.nginx_port}", [(a, 1) for a in chosen]
            )
            write_targets(self.sd_file, chosen)
            self.nginx.proc.send_signal(signal.SIGHUP)


async def _busy(address: str) -> bool:
    """Whether the replica still runs or queues a request (its /metrics)."""
    try:
        async with (
            aiohttp.ClientSession(trust_env=False) as http,
            http.get(f"http://{address}/metrics") as resp,
        ):
            text = await resp.text()
    except (aiohttp.ClientError, OSError):
        return False
    queues = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    return any(
        line.startswith(queues) and float(line.rsplit(" ", 1)[1]) > 0
        for line in text.splitlines()
    )


def write_targets(path: Path, addresses: Sequence[str]) -> None:
    """Prometheus' file_sd file, replaced in one rename."""
    temp = path.with_suffix(".tmp")
    temp.write_text(json.dumps([{"targets": list(addresses)}]), encoding="utf-8")
    os.replace(temp, path)


@dataclass
class Scaler:
    """Every ``tick_s``: read ``query``, ask ``rule``, scale ``fleet``, record."""

    prometheus: PrometheusApi
    query: str
    rule: HorizontalRule
    fleet: Fleet
    log: Path
    tick_s: float

    async def run(self, done: asyncio.Event) -> None:
        start = time.monotonic()
        ticks = 0
        with self.log.open("a", encoding="utf-8") as out:
            while not done.is_set():
                self.fleet.alive()
                value = await self._value()
                now = time.monotonic()
                decision = self.rule.decide(
                    now, value, self.fleet.current, self.fleet.ready
                )
                await self.fleet.scale_to(decision.desired)
                out.write(json.dumps(asdict(decision)) + "\n")
                out.flush()
                ticks += 1
                wait = start + ticks * self.tick_s - time.monotonic()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), max(wait, 0))

    async def _value(self) -> float | None:
        found = await self.prometheus.query(self.query)
        if len(found) != 1:
            return None
        value = float(found[0]["value"][1])
        return None if math.isnan(value) else value


def read_decisions(path: Path) -> list[Decision]:
    """``scaler.jsonl`` back."""
    text = path.read_text(encoding="utf-8")
    return [Decision(**json.loads(line)) for line in text.splitlines() if line]
