"""Sending the run's measured requests, and who is told of each.

A :class:`Sender` is what a driver sends with: it makes request ``index``'s body (the
workload's prompt, the model a mix draws for it), decides whether the client walks
away from it (seeded), sends it on the run's session to the run's URL, and tells the
run's :class:`Hooks` as it goes out, as its first token arrives and when it finishes.
The hooks' first sink is the run's own bookkeeping (the run directory, the live
metrics, the tally, the progress display, the client watch, the guard rail:
:class:`~servemon.loadgen.run.context.RunContext`); a driver adds its own listeners (a
capacity step judging its requests, the control law's models of the server).

Where the requests go out is the sender's :class:`Transport`: this process's
session (None, the default), or a fleet of load machines
(:mod:`servemon.loadgen.fleet`), which sends each request from a worker and hands back
its record in this process's clock; drivers and hooks cannot tell the two apart.
"""

from __future__ import annotations

import random
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol, Unpack

import aiohttp

from servemon.loadgen.run.config import LoadConfig
from servemon.loadgen.send.client import RequestOptions, RequestTags, send_request
from servemon.loadgen.send.timing import RequestTiming
from servemon.loadgen.workloads.modelmix import ModelMix
from servemon.loadgen.workloads.traceprompts import TraceWorkload
from servemon.loadgen.workloads.workload import Prompt, Workload, request_body

__all__ = [
    "FirstToken",
    "Hooks",
    "Sender",
    "Sink",
    "Starter",
    "Transport",
    "endpoint",
    "model_picker",
]

#: Something that takes each finished request.
Sink = Callable[[RequestTiming], None]
#: Something told of each measured request as it goes out: (request id, monotonic
#: time, prompt tokens where the workload knows them).
Starter = Callable[[str, float, int | None], None]
#: Something told as a measured request's first token arrives (request id,
#: monotonic time).
FirstToken = Callable[[str, float], None]


class Transport(Protocol):
    """Where a run's measured requests go out from, other than this process."""

    #: How long before its time a request is handed over.
    ahead_s: float

    async def send(
        self,
        body: dict[str, object],
        *,
        request_id: str,
        stage: int,
        scheduled_s: float | None,
        started: Callable[[], None],
        on_first_token: Callable[[], None] | None,
        options: RequestOptions,
    ) -> RequestTiming:
        """Send one request at ``scheduled_s`` (this process's monotonic clock;
        None: at once, a closed loop's), call ``started`` as it goes out; its
        record, on this process's clock."""
        ...


def model_picker(
    seed: int, mix: ModelMix | None, model: str, workload: Workload
) -> Callable[[int], str] | None:
    """How each request's model is chosen, where requests differ in it: a
    ``--model`` mix, else the models a trace names (its requests that name none
    ask for the run's model)."""
    if mix is not None:
        return lambda index: mix.draw(seed, index)
    if isinstance(workload, TraceWorkload) and workload.models:
        of = workload.model_of
        return lambda index: of(index) or model
    return None


def endpoint(base: str, api: str) -> str:
    """The URL requests of ``api`` (``chat`` or ``completions``) go to at ``base``."""
    return base + ("/v1/chat/completions" if api == "chat" else "/v1/completions")


@dataclass(slots=True)
class Hooks:
    """Who is told of each measured request, in the order they were added."""

    sinks: list[Sink] = field(default_factory=list)
    starters: list[Starter] = field(default_factory=list)
    #: Told as a measured request's first token arrives (streams only).
    first_tokens: list[FirstToken] = field(default_factory=list)

    @contextmanager
    def sink(self, sink: Sink) -> Iterator[None]:
        """``sink`` takes the requests that finish while the block runs."""
        self.sinks.append(sink)
        try:
            yield
        finally:
            self.sinks.remove(sink)

    def started(self, request_id: str, prompt_tokens: int | None = None) -> None:
        """A measured request goes out: every starter is told."""
        if self.starters:
            now = time.monotonic()
            for starter in self.starters:
                starter(request_id, now, prompt_tokens)

    def first_token_hook(self, request_id: str) -> Callable[[], None] | None:
        """What ``send_request`` calls at request ``request_id``'s first token
        (None when nothing listens)."""
        if not self.first_tokens:
            return None
        listeners = tuple(self.first_tokens)

        def arrived() -> None:
            now = time.monotonic()
            for listener in listeners:
                listener(request_id, now)

        return arrived

    def finished(self, timing: RequestTiming) -> None:
        """A measured request finished: every sink gets it."""
        for sink in self.sinks:
            sink(timing)


@dataclass(slots=True, kw_only=True)
class Sender:
    """Sends the run's measured requests (see the module docstring).

    ``config`` is read for the request's settings only (API, streaming,
    ``ignore_eos``, extra body fields, the timeout, the seeded cancellations).
    """

    session: aiohttp.ClientSession
    #: The completions endpoint of the API asked for (:func:`endpoint`).
    url: str
    headers: dict[str, str]
    config: LoadConfig
    workload: Workload
    #: The run's model, or the names a mix uses comma-joined.
    model: str
    #: The model of each request (or session) index, when requests differ in it:
    #: a ``--model`` mix's seeded draw, or the models a trace names.
    pick_model: Callable[[int], str] | None = None
    #: A prefix of this run's request ids (shards of one schedule differ in it).
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    hooks: Hooks = field(default_factory=Hooks)
    #: Measured requests sent so far.
    sent: int = 0
    #: A sessions workload's turns sent, by stage.
    turns_sent: Counter[int] = field(default_factory=Counter)
    #: Where the requests go out from: None, this process's session.
    transport: Transport | None = None

    @property
    def ahead_s(self) -> float:
        """How long before its time a request is handed to the transport."""
        return 0.0 if self.transport is None else self.transport.ahead_s

    def body(self, index: int) -> dict[str, object]:
        """The request body of prompt ``index``."""
        return self.body_of(self.workload.prompt(index), self.model_of(index))

    def body_of(self, prompt: Prompt, model: str) -> dict[str, object]:
        """The request body of ``prompt``, asking for ``model``."""
        c = self.config
        return request_body(
            prompt,
            api=c.api,
            model=model,
            stream=c.stream,
            ignore_eos=c.ignore_eos,
            extra_body=c.extra_body,
        )

    def model_of(self, index: int) -> str:
        """The model request (or session) ``index`` asks for: a ``--model`` mix's
        seeded draw, else the run's model."""
        pick = self.pick_model
        return self.model if pick is None else pick(index)

    def request_options(self, index: int, model: str | None = None) -> RequestOptions:
        """Keyword arguments of :func:`~servemon.loadgen.send.client.send_request` for
        request ``index``: whether the client walks away from it (seeded), and the model
        of a mix it asked for (``model``, where the caller has drawn it already)."""
        c = self.config
        options: RequestOptions = {}
        if self.pick_model is not None:
            drawn = self.pick_model(index) if model is None else model
            options["tags"] = RequestTags(model=drawn)
        if c.cancel_fraction <= 0:
            return options
        if random.Random(f"cancel:{c.seed}:{index}").random() >= c.cancel_fraction:
            return options
        options["cancel_after_s"] = c.cancel_after
        options["cancel_after_tokens"] = c.cancel_after_tokens
        return options

    def started(self, request_id: str, prompt_tokens: int | None = None) -> None:
        """A measured request goes out (sent elsewhere: a closed loop's)."""
        self.sent += 1
        self.hooks.started(request_id, prompt_tokens)

    async def send_now(
        self,
        body: dict[str, object],
        *,
        request_id: str,
        stage: int,
        **options: Unpack[RequestOptions],
    ) -> RequestTiming:
        """Send one request at once and tell no hook: a closed loop's
        (:class:`~servemon.loadgen.send.closedloop.SendNow`), which tells the hooks
        itself. Through the transport where there is one."""
        if self.transport is None:
            return await send_request(
                self.session,
                self.url,
                body,
                request_id=request_id,
                stage=stage,
                headers=self.headers,
                timeout_s=self.config.timeout,
                record_interruption=True,
                **options,
            )
        return await self.transport.send(
            body,
            request_id=request_id,
            stage=stage,
            scheduled_s=None,
            started=_nothing,
            on_first_token=None,
            options=options,
        )

    async def send(
        self,
        body: dict[str, object],
        *,
        request_id: str,
        stage: int,
        scheduled_s: float,
        prompt_tokens: int | None = None,
        **options: Unpack[RequestOptions],
    ) -> RequestTiming:
        """Send one measured request and tell the hooks; ``options`` go to
        :func:`~servemon.loadgen.send.client.send_request` (what :meth:`request_options`
        chose, the encoded body, a session turn's tags)."""
        if self.transport is not None:
            timing = await self.transport.send(
                body,
                request_id=request_id,
                stage=stage,
                scheduled_s=scheduled_s,
                started=lambda: self.started(request_id, prompt_tokens),
                on_first_token=self.hooks.first_token_hook(request_id),
                options=options,
            )
            self.hooks.finished(timing)
            return timing
        self.started(request_id, prompt_tokens)
        timing = await send_request(
            self.session,
            self.url,
            body,
            request_id=request_id,
            stage=stage,
            scheduled_s=scheduled_s,
            headers=self.headers,
            timeout_s=self.config.timeout,
            record_interruption=True,
            on_first_token=self.hooks.first_token_hook(request_id),
            **options,
        )
        self.hooks.finished(timing)
        return timing


def _nothing() -> None:
    pass
