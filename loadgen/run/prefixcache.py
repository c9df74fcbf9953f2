"""What a ``prefix:`` workload needs from its target before a run, and its warm
prompts sent.

The engine's block size and cache size come from the line vLLM publishes its cache
config on (``vllm:cache_config_info``: ``block_size``, ``num_gpu_blocks``), read
through the sampler's normalizer; an engine that does not publish them gets vLLM's
usual 16 and no cache check. What the server adds around the content (the chat
template, or a BOS token on completions) comes from its ``/tokenize``: two requests
whose contents differ at both ends, and the tokens their answers have in common at
the head and at the tail. A target without ``/tokenize`` (or one that answers
otherwise) counts as adding nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypedDict

import aiohttp

from servemon.core.errors import TargetError
from servemon.core.jsonvalue import JSONValue
from servemon.core.wire.http import NotAnswered, post, post_json
from servemon.core.wire.limits import ResponseTooLarge, read_body
from servemon.loadgen.run.sampler import parse_engine_samples

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "PrefixOptions",
    "PrefixTarget",
    "find_prefix_target",
    "send_warm",
]

#: vLLM's block size when the engine does not say its own.
DEFAULT_BLOCK_SIZE = 16
_PROBE_TIMEOUT = aiohttp.ClientTimeout(total=10)
#: Two contents that differ in their first and last words, common English (in
#: servemon's word list) so that even a small word-level vocabulary has them.
_PROBES = ("apple river house zebra", "water river house yellow")


class PrefixOptions(TypedDict, total=False):
    """``build_workload``'s keyword arguments for a ``prefix:`` workload."""

    block_size: int
    cache_tokens: int | None
    overhead_tokens: int
    tail_tokens: int


@dataclass(frozen=True, slots=True)
class PrefixTarget:
    """The engine's facts a ``prefix:`` workload is built on, and where each came
    from (recorded with the run)."""

    block_size: int
    cache_tokens: int | None
    overhead_tokens: int
    tail_tokens: int
    block_source: Literal["cache_config_info", "default"]
    overhead_source: Literal["tokenize", "none"]

    def build_options(self) -> PrefixOptions:
        """``build_workload``'s keyword arguments for a ``prefix:`` workload."""
        return {
            "block_size": self.block_size,
            "cache_tokens": self.cache_tokens,
            "overhead_tokens": self.overhead_tokens,
            "tail_tokens": self.tail_tokens,
        }


async def find_prefix_target(
    session: aiohttp.ClientSession,
    base: str,
    model: str,
    api: Literal["chat", "completions"],
    headers: Mapping[str, str],
) -> PrefixTarget:
    """The block size, cache size and template overhead of the target at ``base``."""
    (block_size, cache_tokens), overhead = await asyncio.gather(
        _cache_config(session, base, headers),
        _template(session, base, model, api, headers),
    )
    return PrefixTarget(
        block_size=block_size or DEFAULT_BLOCK_SIZE,
        cache_tokens=cache_tokens,
        overhead_tokens=overhead[0] if overhead else 0,
        tail_tokens=overhead[1] if overhead else 0,
        block_source="cache_config_info" if block_size else "default",
        overhead_source="tokenize" if overhead else "none",
    )


async def send_warm(
    session: aiohttp.ClientSession,
    url: str,
    bodies: Sequence[Mapping[str, object]],
    headers: Mapping[str, str],
    timeout_s: float,
) -> None:
    """Send the warm prompts' request bodies, one after another, not streamed; a
    failed one is a :class:`TargetError` (the run's rate would fall short)."""
    for body in bodies:
        whole = {k: v for k, v in body.items() if k != "stream_options"}
        whole["stream"] = False
        try:
            async with asyncio.timeout(timeout_s):
                resp = await post(session, url, body=whole, headers=headers)
                async with resp:
                    await read_body(resp)
                    status = resp.status
        except (
            aiohttp.ClientError,
            NotAnswered,
            TimeoutError,
            ResponseTooLarge,
        ) as exc:
            raise TargetError(
                f"POST {url}: a prefix workload's warm prompt failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if status != 200:
            raise TargetError(
                f"POST {url}: a prefix workload's warm prompt failed: HTTP {status}"
            )


async def _get_text(
    session: aiohttp.ClientSession, url: str, headers: Mapping[str, str]
) -> str | None:
    try:
        async with session.get(url, headers=headers, timeout=_PROBE_TIMEOUT) as resp:
            if resp.status != 200:
                return None
            return (await read_body(resp)).decode("utf-8", "replace")
    except (aiohttp.ClientError, TimeoutError, ResponseTooLarge):
        return None


async def _cache_config(
    session: aiohttp.ClientSession, base: str, headers: Mapping[str, str]
) -> tuple[int | None, int | None]:
    text = await _get_text(session, base + "/metrics", headers)
    if text is None:
        return None, None
    try:
        _samples, info = parse_engine_samples(text)
    except ValueError:
        return None, None
    block_size = _positive(info.get("block_size"))
    blocks = _positive(info.get("num_gpu_blocks"))
    return block_size, (blocks * block_size if blocks and block_size else None)


def _positive(text: str | None) -> int | None:
    try:
        number = int(text) if text is not None else 0
    except ValueError:
        return None
    return number if number > 0 else None


async def _template(
    session: aiohttp.ClientSession,
    base: str,
    model: str,
    api: Literal["chat", "completions"],
    headers: Mapping[str, str],
) -> tuple[int, int] | None:
    """Tokens the server adds before and after the content, or None if its
    ``/tokenize`` does not tell (or tells something that does not add up: the
    content alone plus head and tail must be the whole, for both probes)."""
    wholes, contents = [], []
    for content in _PROBES:
        if api == "chat":
            body: dict[str, object] = {
                "model": model,
                "messages": [{"role": "user", "content": content}],
                "add_generation_prompt": True,
            }
        else:
            body = {"model": model, "prompt": content, "add_special_tokens": True}
        plain = {"model": model, "prompt": content, "add_special_tokens": False}
        whole = await _tokenize(session, base + "/tokenize", body, headers)
        alone = await _tokenize(session, base + "/tokenize", plain, headers)
        if whole is None or alone is None:
            return None
        wholes.append(whole)
        contents.append(len(alone))
    one, two = wholes
    head, tail = _common(one, two), _common(one[::-1], two[::-1])
    if any(len(w) != head + n + tail for w, n in zip(wholes, contents, strict=True)):
        return None
    return head, tail


async def _tokenize(
    session: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, object],
    headers: Mapping[str, str],
) -> list[JSONValue] | None:
    try:
        answer = await post_json(
            session, url, body, headers, _PROBE_TIMEOUT.total or 10.0
        )
    except TargetError:
        return None
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    return tokens if isinstance(tokens, list) else None


def _common(one: Sequence[object], two: Sequence[object]) -> int:
    same = 0
    for a, b in zip(one, two, strict=False):
        if a != b:
            break
        same += 1
    return same
