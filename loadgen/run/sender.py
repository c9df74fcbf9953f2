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

import asyncio
import random
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal, Protocol, Required, TypedDict, Unpack

import aiohttp

from servemon.loadgen.record.line import Line, timing_from_line
from servemon.loadgen.run.config import LoadConfig
from servemon.loadgen.send.arrivals import Due
from servemon.loadgen.send.client import RequestOptions, RequestTags, send_request
from servemon.loadgen.send.dispatch import DispatchCounts
from servemon.loadgen.send.timing import RequestTiming
from servemon.loadgen.workloads.modelmix import ModelMix
from servemon.loadgen.workloads.traceprompts import TraceWorkload
from servemon.loadgen.workloads.workload import Prompt, Workload, request_body

__all__ = [
    "Batch",
    "Dispatcher",
    "FirstToken",
    "Hooks",
    "LoopOptions",
    "Ready",
    "Sender",
    "Sink",
    "Starter",
    "Transport",
    "endpoint",
    "model_picker",
]

#: A request made ready ahead of its time: its body, its send options (the body
#: encoded among them), its prompt tokens; or why it is not sent; None: a
#: conversation, which makes its own.
Ready = tuple[dict[str, object], RequestOptions, int | None] | str | None
#: Something that takes each finished request.
Sink = Callable[[RequestTiming], None]
#: Something told of each measured request as it goes out: (request id, monotonic
#: time, prompt tokens where the workload knows them).
Starter = Callable[[str, float, int | None], None]
#: Something told as a measured request's first token arrives (request id,
#: monotonic time).
FirstToken = Callable[[str, float], None]


class Batch(Protocol):
    """The run's own bookkeeping, taking records a batch at a time (a fleet's
    sliced credits, :mod:`servemon.loadgen.fleet.slices`): it stands for one sink
    and one starter of :class:`Hooks`."""

    @property
    def sink(self) -> Sink:
        """The sink it stands for."""
        ...

    @property
    def starter(self) -> Starter:
        """The starter it stands for."""
        ...

    def handed(self, count: int) -> None:
        """``count`` measured requests handed out to go out (their starts)."""
        ...

    def lines(self, raw: bytes, lines: list[Line]) -> None:
        """Finished requests: their ``requests.jsonl`` lines as they came and as
        objects."""
        ...


class LoopOptions(TypedDict, total=False):
    """What a dispatcher of an open-loop schedule is given
    (:class:`~servemon.loadgen.send.dispatch.OpenLoop`'s, and
    :meth:`Transport.open_loop`'s)."""

    #: Makes request ``due`` ready ahead of its time: its body, options and prompt
    #: tokens, or why it is not sent.
    prepare: Required[Callable[[Due], Ready]]
    #: Told of a request that was due and is not sent, and why.
    not_sent: Required[Callable[[Due, str], None]]
    #: The schedule's first request index (its ids count from it).
    first_index: Required[int]
    max_inflight: Required[int]
    late: Required[Literal["send", "skip"]]
    late_tolerance_s: Required[float]
    on_stage: Callable[[int], None]
    on_skip: Callable[[Due], None]
    on_hold: Callable[[Due], None]


class Dispatcher(Protocol):
    """What sends an open-loop schedule, as a driver follows it."""

    @property
    def in_flight(self) -> int:
        """Requests started (or handed out) and not finished."""
        ...

    #: What the requests in flight wait on (a stop's grace period waits on them).
    tasks: set[asyncio.Task[None]]
    counts: DispatchCounts

    async def run(self, schedule: Iterable[Due], start_s: float) -> None:
        """Send every due request; ``start_s`` is the monotonic time of offset 0."""
        ...


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

    def open_loop(
        self, sender: Sender, **options: Unpack[LoopOptions]
    ) -> Dispatcher | None:
        """What sends an open-loop schedule in batches (None: request by request,
        through :meth:`send`)."""
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
    #: The run's own bookkeeping of a batch of records, where it takes them so.
    batch: Batch | None = None

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

    def batchable(self) -> bool:
        """Whether requests may be taken a batch at a time: the run takes batches
        and no one else listens to each request as it goes out or as its first
        token arrives (a sink beside it is given each request as a timing)."""
        batch = self.batch
        if batch is None or self.first_tokens:
            return False
        return all(starter == batch.starter for starter in self.starters)

    def handed(self, count: int) -> None:
        """``count`` measured requests handed out to go out (:meth:`batchable`)."""
        if self.batch is not None:
            self.batch.handed(count)

    def finished_lines(self, raw: bytes, lines: list[Line]) -> None:
        """Measured requests finished, as ``requests.jsonl`` lines (``raw``, and
        parsed): the run folds them at once; a sink with a ``take_lines`` method
        is given the lines (checked by the run's fold first), any other each
        request as a timing."""
        batch = self.batch
        assert batch is not None
        batch.lines(raw, lines)
        others: list[Sink] = []
        for sink in self.sinks:
            if sink == batch.sink:
                continue
            take_lines = getattr(sink, "take_lines", None)
            if take_lines is not None:  # it takes the lines as they are
                take_lines(lines)
            else:
                others.append(sink)
        if others:
            for line in lines:
                timing = timing_from_line(line)
                for sink in others:
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
