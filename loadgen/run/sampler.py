"""Samples the target's ``/metrics`` during a run into ``server_metrics.jsonl``.

Once a second (by default) the sampler fetches the target's exposition, normalizes it
with the exporter's table (:mod:`servemon.monitor.normalize`: servemon names whatever
the engine and version), keeps gauges, counters and histogram ``_count``/``_sum`` (not
buckets), and appends one line::

    {"mono_s": 123.4,
     "samples": [["servemon_engine_requests_running", {"rank": "0", ...}, 3.0], ...]}

(the ``target`` label is left out: it is the run's target), or
``{"mono_s": ..., "error": "..."}`` when the scrape failed. Parsing runs in a worker
thread so the event loop that sends requests is not held up. Nothing from the network
raises out of the sampler.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

import aiohttp

from servemon.core.wire.limits import read_body
from servemon.loadgen.run.firstread import FirstRead
from servemon.monitor.normalize import Normalizer

__all__ = ["ServerSampler", "parse_engine_samples"]

#: One sample as a line of ``server_metrics.jsonl`` keeps it: ``[name, labels, value]``.
Sample = list[object]


def parse_engine_samples(
    text: str, normalizer: Normalizer | None = None
) -> tuple[list[Sample], dict[str, str]]:
    """An exposition normalized to servemon names, as ``[name, labels, value]``, and
    the engine's self-description (``engine``, ``dialect``, cache config). Pass the
    same ``normalizer`` for every scrape of a target: it remembers."""
    normalized = (normalizer or Normalizer()).normalize(text, target="")
    kept: list[Sample] = []
    for family in normalized.families:
        for sample in family.samples:
            if sample.name.endswith(("_bucket", "_created")):
                continue
            labels = {k: v for k, v in sample.labels.items() if k != "target"}
            kept.append([sample.name, labels, sample.value])
    info = {"engine": normalized.engine, **normalized.info}
    return kept, info


class ServerSampler:
    """Scrapes ``url`` every ``interval_s`` and hands each sample to ``sink``,
    sending ``headers`` (the run's request headers: llama-server's ``--api-key``
    guards ``/metrics``)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        sink: Callable[[Mapping[str, object]], None],
        *,
        interval_s: float = 1.0,
        timeout_s: float = 2.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._session = session
        self._url = url
        self._headers = dict(headers or {})
        self._sink = sink
        self._interval = interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.scrapes = 0
        self.errors = 0
        #: When a scrape first worked (a target late at the start is tried again
        #: every round).
        self.first = FirstRead()
        self.last: list[Sample] = []
        self.engine_info: dict[str, str] = {}
        self._normalizer = Normalizer()

    async def sample_once(self) -> list[Sample] | None:
        """One scrape; the samples, or None after recording an error line."""
        now = time.monotonic()
        try:
            async with self._session.get(
                self._url, headers=self._headers, timeout=self._timeout
            ) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                text = (await read_body(resp)).decode("utf-8")
            samples, info = await asyncio.to_thread(
                parse_engine_samples, text, self._normalizer
            )
        except (aiohttp.ClientError, TimeoutError, ValueError, UnicodeError) as exc:
            self.errors += 1
            self.first.tried(now, ok=False)
            self._sink({"mono_s": now, "error": f"{type(exc).__name__}: {exc}"[:300]})
            return None
        self.first.tried(now, ok=True)
        self.scrapes += 1
        self.last = samples
        self.engine_info = info
        self._sink({"mono_s": now, "samples": samples})
        return samples

    async def run(self) -> None:
        """Sample until cancelled, on a fixed cadence."""
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            await self.sample_once()
            next_at += self._interval
            # After a stall, skip the missed rounds rather than run them back to back.
            next_at = max(next_at, loop.time())
            await asyncio.sleep(next_at - loop.time())
