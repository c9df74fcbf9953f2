"""What the load generator finds out about its target (and its own machine) before
a run: the model to use, the engine version, local GPUs, whether the target is on
this machine; :func:`survey` finds them all, into :class:`TargetFacts`."""

from __future__ import annotations

import asyncio
import ipaddress
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from servemon.core.errors import TargetError
from servemon.core.wire.failures import tls_failure
from servemon.core.wire.limits import ResponseTooLarge, head_refused, read_body
from servemon.loadgen.record.sections import (
    EmbeddedSimulator,
    EnvironmentRecord,
    GpuRecord,
    Json,
    TargetRecord,
)
from servemon.loadgen.run.choices import ModelChoice

__all__ = [
    "TargetFacts",
    "check_served",
    "context_of",
    "discover_model",
    "is_loopback",
    "local_gpus",
    "survey",
    "target_version",
]


@dataclass(frozen=True, slots=True)
class TargetFacts:
    """What a run found out before it started: the target's base URL, the model
    to ask for (a mix: its names joined by commas), its ``/v1/models`` answer and
    engine version, and the GPUs where the load generator runs."""

    base: str
    model: str
    listing: Json
    version: str | None
    gpus: list[GpuRecord] | str

    @property
    def context(self) -> int | None:
        """The target's context in tokens (:func:`context_of`)."""
        return context_of(self.listing, self.model)

    def record(self, embedded: EmbeddedSimulator | None) -> TargetRecord:
        """``run.json``'s ``target`` (``embedded``: the simulator started for the
        run, if one was)."""
        return TargetRecord(self.base, self.model, self.listing, embedded)

    def environment(self) -> EnvironmentRecord:
        """``run.json``'s ``environment``: this process's, with the GPUs found."""
        return EnvironmentRecord.here(self.gpus)


async def survey(
    session: aiohttp.ClientSession,
    base: str,
    chosen: ModelChoice | None,
    headers: Mapping[str, str],
) -> TargetFacts:
    """Find out about the target at ``base``: the model (``--model``, else the
    first it lists; every model of a mix, each checked served), its version,
    and this machine's GPUs."""
    mix = None if chosen is None or chosen.mix is None else chosen.mix.names
    name = None if chosen is None else chosen.name
    model, listing = await discover_model(session, base, name, headers)
    if mix is not None:
        check_served(base, listing, mix)
        model = ",".join(mix)
    version, gpus = await asyncio.gather(
        target_version(session, base, headers), asyncio.to_thread(local_gpus)
    )
    return TargetFacts(base, model, listing, version, gpus)


async def target_version(
    session: aiohttp.ClientSession,
    base_url: str,
    headers: Mapping[str, str] | None = None,
) -> str | None:
    """The engine version from ``/version`` (vLLM has it), else None; sent the
    run's request ``headers`` like every call to the target."""
    try:
        async with session.get(
            base_url.rstrip("/") + "/version",
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=5),
        ) as resp:
            if resp.status != 200:
                return None
            body = json.loads(await read_body(resp))
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    version = body.get("version") if isinstance(body, dict) else None
    return str(version) if version is not None else None


def local_gpus() -> list[GpuRecord] | str:
    """GPU names, driver and memory from NVML where the load generator runs, or
    why there are none (blocking: call through a thread)."""
    from servemon.monitor.gpu import GpuUnavailable
    from servemon.monitor.nvml import NvmlReader

    reader = NvmlReader()
    try:
        reader.open()
        snapshot = reader.read()
    except GpuUnavailable as exc:
        return f"none ({exc})"
    except Exception as exc:
        return f"none ({type(exc).__name__}: {exc})"
    finally:
        reader.close()
    return [
        GpuRecord(
            g.index, g.name, g.uuid, snapshot.driver_version, g.memory_total_bytes
        )
        for g in snapshot.gpus
    ]


def context_of(listing: Any, model: str) -> int | None:
    """The context in tokens that ``/v1/models`` says ``model`` (of a mix, the
    smallest) takes: vLLM's ``max_model_len``; None where it says none."""
    data = listing.get("data") if isinstance(listing, dict) else None
    names = set(model.split(","))
    found = [
        m["max_model_len"]
        for m in data or ()
        if isinstance(m, dict)
        and m.get("id") in names
        and isinstance(m.get("max_model_len"), int)
        and not isinstance(m.get("max_model_len"), bool)
        and m["max_model_len"] > 0
    ]
    return min(found) if found else None


async def discover_model(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str | None,
    headers: Mapping[str, str] | None = None,
) -> tuple[str, Any]:
    """The model to use (``model`` or the first of ``/v1/models``) and the listing;
    ``/v1/models`` is sent the run's request ``headers`` (vLLM's and
    llama-server's ``--api-key`` guard it)."""
    url = base_url.rstrip("/") + "/v1/models"
    try:
        async with session.get(
            url, headers=headers, timeout=aiohttp.ClientTimeout(total=10)
        ) as resp:
            if resp.status != 200:
                raise TargetError(f"{url}: HTTP {resp.status}")
            listing = json.loads(await read_body(resp))
    except TimeoutError:
        raise TargetError(f"{url}: no answer within 10 s") from None
    except aiohttp.ClientConnectorError as exc:
        why = tls_failure(exc) or f"{type(exc).__name__}: {exc}"
        raise TargetError(f"{url}: {why}") from None
    except ResponseTooLarge as exc:
        raise TargetError(f"{url}: {exc}") from None
    except (aiohttp.ClientError, ValueError) as exc:
        why = head_refused(exc) or f"{type(exc).__name__}: {exc}"
        raise TargetError(f"{url}: {why}") from None
    ids = [m.get("id") for m in listing.get("data", []) if isinstance(m, dict)]
    if model is None:
        if not ids or not isinstance(ids[0], str):
            raise TargetError(f"{url}: no models listed; give --model")
        model = ids[0]
    return model, listing


def check_served(base_url: str, listing: Any, names: Sequence[str]) -> None:
    """Every model of ``names`` is one the target lists (base models and LoRA
    adapters alike), or a one-line :class:`TargetError` naming the first that is
    not. A target that lists nothing is taken at its word."""
    data = listing.get("data") if isinstance(listing, dict) else None
    ids = {m.get("id") for m in data or () if isinstance(m, dict)}
    if not ids:
        return
    for name in names:
        if name not in ids:
            served = ", ".join(sorted(str(i) for i in ids))
            raise TargetError(
                f"--model {name}: not served by {base_url} (it lists: {served})"
            )


def is_loopback(url: str) -> bool:
    """Whether ``url`` points at this machine."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
