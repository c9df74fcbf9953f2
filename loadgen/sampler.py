"""Samples the target's ``/metrics`` during a run into ``server_metrics.jsonl``.

Once a second (by default) the sampler fetches the target's exposition, keeps the
engine's families (``vllm:``, ``sglang:``, ``tgi_``, ``llamacpp:``) without histogram
buckets or ``_created`` samples, and appends one line::

    {"mono_s": 123.4,
     "samples": [["vllm:num_requests_running", {"engine": "0", ...}, 3.0], ...]}

or ``{"mono_s": ..., "error": "..."}`` when the scrape failed. Names are the engine's
own until the exporter's normalization table exists. Parsing runs in a worker thread so
the event loop that sends requests is not held up. Nothing from the network raises
out of the sampler.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["ENGINE_PREFIXES", "ServerSampler", "parse_engine_samples"]

ENGINE_PREFIXES = ("vllm:", "sglang:", "tgi_", "llamacpp:")
Sample = list[Any]


def parse_engine_samples(text: str) -> list[Sample]:
    """The engine samples of an exposition, as ``[name, labels, value]``."""
    kept: list[Sample] = []
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(ENGINE_PREFIXES):
            continue
        for sample in family.samples:
            if sample.name.endswith(("_bucket", "_created")):
                continue
            kept.append([sample.name, dict(sample.labels), sample.value])
    return kept


class ServerSampler:
    """Scrapes ``url`` every ``interval_s`` and hands each sample to ``sink``."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        sink: Callable[[Mapping[str, Any]], None],
        *,
        interval_s: float = 1.0,
        timeout_s: float = 2.0,
    ) -> None:
        self._session = session
        self._url = url
        self._sink = sink
        self._interval = interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.scrapes = 0
        self.errors = 0
        self.last: list[Sample] = []

    async def sample_once(self) -> list[Sample] | None:
        """One scrape; the samples, or None after recording an error line."""
        now = time.monotonic()
        try:
            async with self._session.get(self._url, timeout=self._timeout) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                text = await resp.text()
            samples = await asyncio.to_thread(parse_engine_samples, text)
        except (aiohttp.ClientError, TimeoutError, ValueError, UnicodeError) as exc:
            self.errors += 1
            self._sink({"mono_s": now, "error": f"{type(exc).__name__}: {exc}"[:300]})
            return None
        self.scrapes += 1
        self.last = samples
        self._sink({"mono_s": now, "samples": samples})
        return samples

    async def run(self) -> None:
        """Sample until cancelled, on a fixed cadence."""
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            await self.sample_once()
            next_at += self._interval
            await asyncio.sleep(max(0.0, next_at - loop.time()))
