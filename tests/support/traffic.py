"""Traffic for tests that need a server's counters to move."""

from __future__ import annotations

import asyncio

import aiohttp

__all__ = ["prefix_traffic"]


async def prefix_traffic(
    http: aiohttp.ClientSession, url: str, *, repeats: int = 3
) -> None:
    """Distinct prompts at once, then one prompt ``repeats`` times (prefix hits)."""

    async def one(content: str, max_tokens: int) -> None:
        body = {
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "stream": True,
        }
        async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            await resp.read()

    prompt = " ".join(f"w{i}" for i in range(80))
    await asyncio.gather(*(one(f"{prompt} x{i}", 6) for i in range(3)))
    for _ in range(repeats):
        await one(prompt, 3)
