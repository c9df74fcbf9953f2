"""The engine collector: every target's ``/metrics``, fetched and normalized per scrape.

On each scrape of the exporter, :meth:`EngineCollector.collect` fetches every target
concurrently with a timeout below the scrape's own, then normalizes each answer in
turn (one :class:`~servemon.monitor.normalize.Normalizer` per target), and returns a
:class:`Scrape`: servemon's engine families plus, per target, ``servemon_target_up``,
``servemon_target_scrape_duration_seconds`` (the target's own fetch and its own
processing: fetching everything first keeps one target's processing out of another's
time) and ``servemon_target_scrape_errors_total{reason}``. A target that is down,
slow, too large or answers garbage gets ``up 0`` and no engine series at all (nothing
stale is served); it never fails the exporter's scrape. What the engine tells about
itself (``/v1/models``, ``/version``, cache config) goes into ``servemon_engine_info``,
refreshed once a minute. :meth:`EngineCollector.encode` writes a scrape in the
scraper's format (:mod:`servemon.monitor.render`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from servemon.core import names
from servemon.core.jsonvalue import JSONObject
from servemon.core.wire.limits import ResponseTooLarge, read_body
from servemon.monitor.normalize import Normalized, Normalizer
from servemon.monitor.render import Encoder, Renderer

__all__ = ["ERROR_REASONS", "EngineCollector", "Scrape", "Target"]

ERROR_REASONS = ("connect", "timeout", "http", "too_large", "parse")
_Row = tuple[dict[str, str], float]
INFO_REFRESH_S = 60.0


@dataclass(frozen=True, slots=True)
class Target:
    """One endpoint to watch."""

    url: str
    name: str
    engine: str | None = None
    model: str | None = None


@dataclass(slots=True)
class _TargetState:
    normalizer: Normalizer = field(default_factory=Normalizer)
    errors: Counter[str] = field(default_factory=Counter)
    models: list[JSONObject] = field(default_factory=list)
    version: str | None = None
    info_at: float = -INFO_REFRESH_S
    info_task: asyncio.Task[None] | None = None


@dataclass(slots=True)
class Scrape:
    """One scrape of every target."""

    #: ``servemon_target_up``, ``_scrape_duration_seconds``, ``_scrape_errors_total``
    #: and ``servemon_engine_info``.
    targets: list[Metric]
    #: The engine families of each target that answered, in target order.
    results: list[Normalized]
    #: Other families were passed through (they are written as families).
    passthrough: bool = False

    def families(self) -> list[Metric]:
        """Everything as prometheus_client families; same-named families of several
        targets are merged into one with the first one's name, help and type."""
        by_name: dict[str, Metric] = {}
        for result in self.results:
            for family in result.families:
                merged = by_name.get(family.name)
                if merged is None:
                    merged = by_name[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                merged.samples.extend(family.samples)
        return [*self.targets, *by_name.values()]


class _ScrapeFailed(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class EngineCollector:
    """Scrapes targets on demand; one instance lives as long as the exporter."""

    def __init__(
        self,
        targets: list[Target],
        session: aiohttp.ClientSession,
        *,
        timeout_s: float = 2.5,
        max_bytes: int = 8 * 1024 * 1024,
        passthrough: bool = False,
    ) -> None:
        self.targets = targets
        self._session = session
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.passthrough = passthrough
        self._state = {t.name: _TargetState() for t in targets}
        self._renderer = Renderer()
        self.last_error: dict[str, str] = {}

    async def close(self) -> None:
        """Cancel background refreshes."""
        tasks = [s.info_task for s in self._state.values() if s.info_task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def model_of(self, target: Target) -> str | None:
        """The configured model, else the first one the target lists."""
        if target.model:
            return target.model
        models = self._state[target.name].models
        first = models[0].get("id") if models else None
        return first if isinstance(first, str) else None

    async def scrape(self, timeout_s: float | None = None) -> list[Metric]:
        """Scrape every target now; servemon families for all of them."""
        return (await self.collect(timeout_s)).families()

    async def collect(self, timeout_s: float | None = None) -> Scrape:
        """Scrape every target now: fetch all at once, then process each answer."""
        timeout = min(self.timeout_s, timeout_s) if timeout_s else self.timeout_s
        fetched = await asyncio.gather(
            *(self._fetch_timed(t, timeout) for t in self.targets)
        )
        up: list[_Row] = []
        took: list[_Row] = []
        errors: list[_Row] = []
        info: list[_Row] = []
        results: list[Normalized] = []
        for target, (body, fetch_s) in zip(self.targets, fetched, strict=True):
            start = time.monotonic()
            result = None if body is None else self._process(target, body)
            name = {"target": target.name}
            up.append((name, 0.0 if result is None else 1.0))
            took.append((name, fetch_s + time.monotonic() - start))
            state = self._state[target.name]
            for reason in ERROR_REASONS:
                errors.append(({**name, "reason": reason}, state.errors[reason]))
            if result is None:
                continue
            info.append((self._info_values(target, result), 1.0))
            results.append(result)
        families = [
            names.TARGET_UP.family(up),
            names.TARGET_SCRAPE_DURATION.family(took),
            names.TARGET_SCRAPE_ERRORS.family(errors),
            names.ENGINE_INFO.family(info),
        ]
        return Scrape(families, results, self.passthrough)

    def encode(
        self,
        scrape: Scrape,
        encoder: Encoder,
        content_type: str,
        then: Collector | None = None,
    ) -> bytes:
        """``scrape``, then ``then``'s families, as ``encoder`` (from
        prometheus_client's ``choose_encoder``) writes them: a whole answer."""
        renderer = self._renderer
        if scrape.passthrough:
            pieces = [renderer.encode(encoder, content_type, scrape.families())]
        else:
            pieces = [renderer.encode(encoder, content_type, scrape.targets)]
            pieces += renderer.pieces(scrape.results, encoder, content_type)
        if then is not None:
            pieces.append(renderer.encode(encoder, content_type, then.collect()))
        pieces.append(renderer.trailer(encoder, content_type))
        return "".join(pieces).encode("utf-8")

    def _info_values(self, target: Target, n: Normalized) -> dict[str, str]:
        state = self._state[target.name]
        card = state.models[0] if state.models else {}
        model = next(iter(sorted(n.models)), None) or self.model_of(target) or "unknown"
        values = {
            "target": target.name,
            "model": model,
            "engine": n.engine,
            "version": state.version or "unknown",
            "block_size": n.info.get("block_size", ""),
            "num_gpu_blocks": n.info.get("num_gpu_blocks", ""),
            "prefix_caching": n.info.get("prefix_caching", ""),
            "max_model_len": str(card.get("max_model_len", "")),
            "prefix_cache_unit": n.info.get("prefix_cache_unit", ""),
            "dialect": n.dialect,
        }
        return values

    async def _fetch_timed(
        self, target: Target, timeout_s: float
    ) -> tuple[bytes | None, float]:
        """The target's body (None: failed, counted) and how long it took."""
        state = self._state[target.name]
        start = time.monotonic()
        try:
            if time.monotonic() - state.info_at >= INFO_REFRESH_S:
                # In the background: a slow /v1/models must not fail the scrape.
                state.info_at = time.monotonic()
                state.info_task = asyncio.create_task(self._refresh_info(target, state))
            async with asyncio.timeout(timeout_s):
                body = await self._fetch(target)
        except TimeoutError:
            self._failed(target, "timeout", f"no answer in {timeout_s:g} s")
            return None, time.monotonic() - start
        except _ScrapeFailed as exc:
            self._failed(target, exc.reason, str(exc))
            return None, time.monotonic() - start
        return body, time.monotonic() - start

    def _process(self, target: Target, body: bytes) -> Normalized | None:
        """The target's engine families; None where it won't parse (counted)."""
        state = self._state[target.name]
        try:
            # Strictly: the format is UTF-8, and a body that is not is not served
            # with U+FFFD in its label values (UnicodeDecodeError is a ValueError).
            result = state.normalizer.normalize(
                body.decode("utf-8"),
                target=target.name,
                model=self.model_of(target),
                engine=target.engine,
                passthrough=self.passthrough,
            )
        except (ValueError, LookupError, ArithmeticError) as exc:
            # ValueError is the contract; the others would be a bug met on odd input,
            # which must still not fail the exporter's scrape.
            self._failed(target, "parse", f"{type(exc).__name__}: {exc}")
            return None
        self.last_error.pop(target.name, None)
        return result

    def _failed(self, target: Target, reason: str, detail: str) -> None:
        self._state[target.name].errors[reason] += 1
        self.last_error[target.name] = f"{reason}: {detail}"[:300]

    async def _fetch(self, target: Target) -> bytes:
        url = target.url.rstrip("/") + "/metrics"
        try:
            async with self._session.get(url) as resp:
                if resp.status != 200:
                    raise _ScrapeFailed("http", f"HTTP {resp.status}")
                body = await read_body(resp, self.max_bytes)
        except ResponseTooLarge as exc:
            raise _ScrapeFailed("too_large", str(exc)) from exc
        except aiohttp.ClientConnectorError as exc:
            raise _ScrapeFailed("connect", str(exc)) from exc
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
            raise _ScrapeFailed("connect", f"{type(exc).__name__}: {exc}") from exc
        return body

    async def _refresh_info(self, target: Target, state: _TargetState) -> None:
        """Best effort: ``/v1/models`` and ``/version``; failures are ignored."""
        base = target.url.rstrip("/")
        for path in ("/v1/models", "/version"):
            try:
                async with self._session.get(
                    base + path, timeout=aiohttp.ClientTimeout(total=10)
                ) as resp:
                    if resp.status != 200:
                        continue
                    body = json.loads(await read_body(resp))
            except (aiohttp.ClientError, ConnectionError, ValueError, RuntimeError):
                continue
            if path == "/version" and isinstance(body, dict):
                version = body.get("version")
                state.version = str(version) if version is not None else None
            elif isinstance(body, dict) and isinstance(body.get("data"), list):
                state.models = [m for m in body["data"] if isinstance(m, dict)]
