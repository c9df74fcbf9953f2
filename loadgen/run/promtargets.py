"""Prometheus' scrape interval of the targets behind ``--select``, asked of
Prometheus itself (a ``--prometheus`` run without ``--scrape-interval``).

The interval sets how stale a signal may be before it is missing, and how long
``servemon control`` waits between rate changes (a change shows in the signal a
scrape later). Assumed, it is wrong whenever Prometheus is not at the old default
of 15 s: a Prometheus scraping every second then gets a controller that waits
half a minute between changes. Prometheus says it: its targets API
(``/api/v1/targets``) gives every active target's labels and ``scrapeInterval``.

Which targets are behind the selector: those that expose servemon series the
``--select`` matchers pick (an instant query grouping them by ``job`` and
``instance``), so a matcher on a label of the series (``target``, ``model``)
counts as well as one on the target's own labels. With no such series yet, the
targets whose labels satisfy the matchers on the labels targets carry (a matcher
on a label no target has is the series' and is left out). The largest
interval among them is the one a signal can be as old as. If Prometheus cannot
say (down, no target, an answer without the field), :data:`DEFAULT_S` stands, and
the record says why. Every read is bounded: :data:`TIMEOUT_S` and
:data:`~servemon.core.wire.limits.DEFAULT_LIMITS`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from servemon.core import promql
from servemon.core.wire.limits import DEFAULT_LIMITS, ResponseTooLarge, read_body
from servemon.loadgen.record.sections import ScrapeIntervalRecord

__all__ = ["DEFAULT_S", "TIMEOUT_S", "ScrapeInterval", "find_scrape_interval"]

#: What a run assumes when neither the flag nor Prometheus says (Prometheus'
#: own default).
DEFAULT_S = 15.0
#: Seconds each of the two reads may take, the body included.
TIMEOUT_S = 5.0
#: Every servemon series: the engine's and GPU's (exporter) and the client's.
_SERVEMON = '__name__=~"servemon_.+"'
_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)(=~|!~|!=|=)"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class ScrapeInterval:
    """The scrape interval a run goes by, and where it came from: ``flag``
    (``--scrape-interval``), ``prometheus`` (the targets API) or ``default``
    (Prometheus could not say: ``why``)."""

    seconds: float
    source: str
    #: How the targets were picked: ``series`` (they expose the selected
    #: series) or ``labels`` (their own labels satisfy the matchers).
    matched_by: str | None = None
    #: ``job/instance`` of each target picked, with its interval.
    targets: tuple[tuple[str, float], ...] = ()
    why: str | None = None

    def record(self) -> ScrapeIntervalRecord:
        """As ``run.json``'s ``server_metrics.scrape_interval`` keeps it."""
        return ScrapeIntervalRecord(
            self.seconds,
            self.source,
            self.matched_by,
            {name: s for name, s in self.targets} or None,
            self.why,
        )

    def said(self) -> str:
        """The one line a run prints about it."""
        if self.source == "default":
            return (
                f"servemon: warning: Prometheus' scrape interval is not known "
                f"({self.why}); assuming {DEFAULT_S:g} s (--scrape-interval sets it)"
            )
        return (
            f"servemon: Prometheus scrapes the {len(self.targets)} target(s) behind "
            f"--select every {self.seconds:g} s or faster (its targets API)"
        )


class _Unanswered(Exception):
    """Prometheus gave no usable answer."""


@dataclass(frozen=True, slots=True)
class _Api:
    session: aiohttp.ClientSession
    base: str
    headers: Mapping[str, str]
    timeout_s: float
    max_bytes: int

    async def get(self, path: str, params: Mapping[str, str]) -> Any:
        """``data`` of one API answer, read within the time and size limits."""
        try:
            async with self.session.get(
                self.base + path,
                params=params,
                headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            ) as resp:
                raw = await read_body(resp, self.max_bytes)
                status = resp.status
        except TimeoutError:
            raise _Unanswered(f"no answer within {self.timeout_s:g} s") from None
        except ResponseTooLarge as exc:
            raise _Unanswered(str(exc)) from None
        except aiohttp.ClientError as exc:
            raise _Unanswered(f"{type(exc).__name__}: {exc}") from None
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict) or body.get("status") != "success":
            why = body.get("error") if isinstance(body, dict) else None
            raise _Unanswered(f"HTTP {status}: {why or 'not an answer of the API'}")
        return body.get("data")


def _satisfies(
    labels: Mapping[str, str], matchers: Sequence[str], known: set[str]
) -> bool:
    """Whether ``labels`` satisfy every matcher on a label some target carries
    (``known``; a missing label is empty, as Prometheus reads it). A matcher on a
    label no target carries is one of the series' own (``target``, ``model``)."""
    for text in matchers:
        found = _MATCHER.fullmatch(text)
        if found is None:
            continue
        name, op, quoted = found.groups()
        if name not in known:
            continue
        try:
            value = json.loads(f'"{quoted}"')
        except ValueError:
            continue
        have = labels.get(name, "")
        if op in ("=~", "!~"):
            try:
                hit = re.fullmatch(value, have) is not None
            except re.error:
                continue
        else:
            hit = have == value
        if hit != (op in ("=", "=~")):
            return False
    return True


async def find_scrape_interval(
    session: aiohttp.ClientSession,
    url: str,
    matchers: Sequence[str],
    headers: Mapping[str, str] | None = None,
    *,
    timeout_s: float = TIMEOUT_S,
    max_bytes: int = DEFAULT_LIMITS.body_bytes,
) -> ScrapeInterval:
    """The largest scrape interval of the targets behind ``matchers`` (see the
    module), or :data:`DEFAULT_S` with the reason; each read within
    ``timeout_s`` and ``max_bytes``."""
    api = _Api(session, url.rstrip("/"), dict(headers or {}), timeout_s, max_bytes)
    grouped = promql.aggregate(
        "group", promql.braces(_SERVEMON, *matchers), ("job", "instance")
    )
    try:
        data = await api.get("/api/v1/query", {"query": grouped})
        result = data.get("result") if isinstance(data, dict) else None
        behind = {
            (str(m.get("job")), str(m.get("instance")))
            for item in (result if isinstance(result, list) else [])
            if isinstance(item, dict) and isinstance(m := item.get("metric"), dict)
        }
        data = await api.get("/api/v1/targets", {"state": "active"})
    except _Unanswered as exc:
        return ScrapeInterval(DEFAULT_S, "default", why=f"Prometheus: {exc}")
    active = data.get("activeTargets") if isinstance(data, dict) else None
    targets = [
        t
        for t in (active if isinstance(active, list) else [])
        if isinstance(t, dict) and isinstance(t.get("labels"), dict)
    ]
    if behind:
        how = "series"
        picked = [
            t
            for t in targets
            if (str(t["labels"].get("job")), str(t["labels"].get("instance"))) in behind
        ]
    else:
        how = "labels"
        known = {name for t in targets for name in t["labels"]}
        picked = [t for t in targets if _satisfies(t["labels"], matchers, known)]
    if not picked:
        what = "no active target" if not targets else "no active target matches"
        return ScrapeInterval(DEFAULT_S, "default", how, why=f"Prometheus: {what}")
    found: list[tuple[str, float]] = []
    for t in picked:
        seconds = promql.parse_duration(str(t.get("scrapeInterval", "")))
        name = f"{t['labels'].get('job')}/{t['labels'].get('instance')}"
        if seconds is None or seconds <= 0:
            return ScrapeInterval(
                DEFAULT_S,
                "default",
                how,
                why=f"Prometheus: no scrapeInterval in target {name}",
            )
        found.append((name, seconds))
    return ScrapeInterval(max(s for _, s in found), "prometheus", how, tuple(found))
