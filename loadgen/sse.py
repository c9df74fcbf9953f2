"""Server-sent events from an aiohttp response, one ``data`` payload at a time.

The framing is the part of the SSE standard that OpenAI-compatible servers use:
``data:`` lines (several join with newlines), events ended by a blank line, comment
lines starting with ``:``, other fields ignored. A stream that ends mid-event yields
what it had.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import StreamReader

__all__ = ["iter_events"]


async def iter_events(content: StreamReader) -> AsyncIterator[str]:
    """Yield each event's data as text."""
    data: list[str] = []
    async for raw in content:
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)
