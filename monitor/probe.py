"""The canary probe: one tiny streamed chat request per target, every interval.

It answers "how long would a user wait right now?" even when traffic is quiet:
``servemon_probe_ttft_seconds`` (to the first chunk with content, never the role
chunk), ``servemon_probe_e2e_seconds`` and ``servemon_probe_requests_total{outcome}``.
An answer is complete by the same rule as the load generator's (a finish, with
``[DONE]`` optional), and a request that met a pooled connection the server had
closed is resent on a new one (:mod:`servemon.core.wire.http`). Probe requests carry
``X-Servemon-Probe: 1`` (and an ``X-Request-Id`` starting with
``servemon-probe-``) so that they can be told apart in the server's logs. Nothing
from the network raises out of a probe.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Mapping

import aiohttp
from prometheus_client import CollectorRegistry

from servemon.core import names
from servemon.core.buckets import PROBE_BUCKETS
from servemon.core.outcomes import Outcome
from servemon.core.wire.failures import ENDINGS, ending
from servemon.core.wire.http import post
from servemon.core.wire.limits import read_body
from servemon.core.wire.sse import choice_text, ends_answer, is_done, iter_events
from servemon.monitor.engine import Target

__all__ = ["PROBE_HEADER", "Prober"]

PROBE_HEADER = "X-Servemon-Probe"


class Prober:
    """Runs the probe for every target; its series live on :attr:`registry`."""

    def __init__(
        self,
        targets: list[Target],
        session: aiohttp.ClientSession,
        model_of: Callable[[Target], str | None],
        *,
        interval_s: float,
        prompt: str = "Say hello.",
        max_tokens: int = 8,
        timeout_s: float = 30.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.targets = targets
        self._session = session
        self._model_of = model_of
        self.interval_s = interval_s
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        self._headers = dict(headers or {})
        self._ids = itertools.count()
        self._listed: dict[str, str] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = names.PROBE_REQUESTS.counter(r)
        self.ttft = names.PROBE_TTFT.histogram(r, PROBE_BUCKETS)
        self.e2e = names.PROBE_E2E.histogram(r, PROBE_BUCKETS)

    async def run(self) -> None:
        """Probe every target each interval until cancelled."""
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            await asyncio.gather(*(self.probe(t) for t in self.targets))
            next_at += self.interval_s
            # After a stall, skip the missed rounds rather than run them back to back.
            next_at = max(next_at, loop.time())
            await asyncio.sleep(next_at - loop.time())

    async def probe(self, target: Target) -> str:
        """One probe of ``target``; returns its outcome."""
        model = self._model_of(target) or await self._listed_model(target)
        body: dict[str, object] = {
            "messages": [{"role": "user", "content": self.prompt}],
            "max_tokens": self.max_tokens,
            "stream": True,
        }
        if model:
            body["model"] = model
        headers = {
            **self._headers,
            PROBE_HEADER: "1",
            "X-Request-Id": f"servemon-probe-{next(self._ids)}",
        }
        url = target.url.rstrip("/") + "/v1/chat/completions"
        sent = time.monotonic()
        first: float | None = None
        outcome = Outcome.OK
        try:
            async with asyncio.timeout(self.timeout_s):
                resp = await post(self._session, url, body=body, headers=headers)
                async with resp:
                    if resp.status != 200:
                        outcome = Outcome.HTTP_ERROR
                    else:
                        finished = False
                        async for data in iter_events(resp.content):
                            if is_done(data):
                                finished = True  # [DONE] is optional, not required
                                break
                            event = _event(data)
                            if first is None and _has_content(event):
                                first = time.monotonic()
                            finished = finished or ends_answer(event)
                        if not finished:
                            outcome = Outcome.STREAM_ERROR
        except ENDINGS as exc:
            # The probe's deadline is a read timeout; a connect's is connect_error,
            # as the load generator labels it (one definition: core.wire.failures).
            outcome, _why = ending(exc)
        end = time.monotonic()
        labels = (target.name, model or "unknown")
        self.requests.labels(*labels, outcome).inc()
        if outcome is Outcome.OK:
            if first is not None:
                self.ttft.labels(*labels).observe(first - sent)
            self.e2e.labels(*labels).observe(end - sent)
        return outcome

    async def _listed_model(self, target: Target) -> str | None:
        """The first model of the target's ``/v1/models`` (remembered), or None."""
        if target.name in self._listed:
            return self._listed[target.name]
        try:
            async with self._session.get(
                target.url.rstrip("/") + "/v1/models",
                timeout=aiohttp.ClientTimeout(total=min(5.0, self.timeout_s)),
            ) as resp:
                raw = await read_body(resp) if resp.status == 200 else b"{}"
            body = json.loads(raw)
        except (aiohttp.ClientError, TimeoutError, ValueError, RuntimeError):
            return None
        data = body.get("data") if isinstance(body, dict) else None
        first = data[0].get("id") if isinstance(data, list) and data else None
        if isinstance(first, str):
            self._listed[target.name] = first
            return first
        return None


def _event(data: str) -> dict[str, object]:
    try:
        event = json.loads(data)
    except json.JSONDecodeError:
        return {}
    return event if isinstance(event, dict) else {}


def _has_content(event: dict[str, object]) -> bool:
    choices = event.get("choices")
    if not isinstance(choices, list):
        return False
    return any(isinstance(c, dict) and choice_text(c) for c in choices)
