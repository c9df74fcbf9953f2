"""Multi-turn sessions against the simulator over real sockets: each turn carries
the conversation so far, later turns find their history in the prefix cache, and
the two ways of setting the load send what they say."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from servemon.loadgen.record.runrecord import RunResult
from servemon.loadgen.reports.report import write_report
from servemon.simulator.config import SimConfig
from servemon.simulator.server import SimServer
from tests.support.margins import Margin
from tests.support.runs import config_for, run

pytestmark = pytest.mark.integration

#: A long opening message (a pasted document) and short follow-ups: turn 1 has its
#: whole prompt to prefill, a later turn only its new message when the cache holds
#: the rest.
SPEC = "sessions:turns=4,think=0.2,first=2048,user=32,output=16"
#: Turn 2's TTFT p50 with the cache over without it: 0.30-0.43 measured; a cache
#: that is not used, or used without being on, makes it about 1.
TURN_2_BOUND = 0.7


def _sessions(
    tmp_path: Path, *, caching: bool, kind: str = "ramp", **fields: Any
) -> RunResult:
    async def go() -> RunResult:
        config = SimConfig(
            host="127.0.0.1",
            port=0,
            enable_prompt_tokens_details=True,
            enable_prefix_caching=caching,
        )
        async with SimServer(config) as server:
            config = config_for(server, tmp_path, kind, timeout=30.0, **fields)
            return await run(kind, config)

    return asyncio.run(asyncio.wait_for(go(), 90))


def _lines(result: RunResult) -> list[dict[str, Any]]:
    text = (result.path / "requests.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def test_later_turns_find_their_history_in_the_prefix_cache(
    tmp_path: Path, margin: Margin
) -> None:
    cached = _sessions(tmp_path / "on", caching=True, workload=SPEC, stages="1:6")
    assert cached.status == "completed"
    stage = cached.stages[0]
    assert stage.label == "1 sessions/s"
    assert stage.sessions is not None
    assert stage.sessions >= 3
    lines = _lines(cached)
    assert stage.sent == len(lines)
    assert {x["outcome"] for x in lines} == {"ok"}

    by_session: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in lines:
        by_session[line["session"]].append(line)
    assert stage.start_s is not None
    end_of_schedule = stage.start_s + 6.0 + cached.info.origin_s
    for turns in by_session.values():
        turns.sort(key=lambda x: x["turn"])
        assert [t["turn"] for t in turns] == list(range(1, len(turns) + 1))
        assert turns[0]["history_tokens"] == 0
        for before, after in itertools.pairwise(turns):
            # Sent after the last answer and a think time, never before it.
            assert after["scheduled_s"] >= before["end_s"]
            assert after["sent_s"] >= after["scheduled_s"]
            # The history is everything the server saw and said last turn, and
            # this turn's prompt is that and a new message of 32 words.
            assert after["history_tokens"] == (
                before["prompt_tokens"] + before["output_tokens"]
            )
            assert after["prompt_tokens"] >= after["history_tokens"] + 32
        assert all(t["scheduled_s"] <= end_of_schedule for t in turns)

    summary = cached.record
    assert summary.by_turn is not None
    first, second = summary.by_turn["1"], summary.by_turn["2"]
    assert first.cached_fraction is not None
    assert first.cached_fraction < 0.05  # every opening message is new
    assert second.cached_fraction is not None
    assert second.cached_fraction > 0.9
    cached_2 = second.figure("ttft")
    assert cached_2 is not None

    # The same conversations without a prefix cache: the second turn prefills its
    # whole history again. What the cache buys it is held against that turn, not
    # against turn 1: the two are alike without a cache (2,106 prompt tokens
    # against 2,052), and a turn's TTFT moves with the other sessions' prefills it
    # shares steps with (uncached turn 2 / turn 1: 0.91-1.33 in 15 runs under load).
    uncached = _sessions(tmp_path / "off", caching=False, workload=SPEC, stages="1:6")
    plain = uncached.record.by_turn
    assert plain is not None
    assert plain["2"].cached_fraction == 0
    plain_2 = plain["2"].figure("ttft")
    assert plain_2 is not None
    margin(
        "turn 2 TTFT p50, cached / uncached",
        cached_2.p50 / plain_2.p50,
        below=TURN_2_BOUND,
        why=f"cached {cached_2.p50:.3f} s, uncached {plain_2.p50:.3f} s",
    )

    # The report draws TTFT by turn.
    page = write_report(cached.path).read_text(encoding="utf-8")
    section = page[page.index("id='by-turn'") :]
    assert "<svg" in section[: section.index("<h2", 10)]
    assert f"turn {max(map(int, summary.by_turn))}" in section


def test_users_run_sessions_back_to_back_up_to_the_number_of_turns(
    tmp_path: Path,
) -> None:
    result = _sessions(
        tmp_path,
        caching=True,
        kind="sweep",
        workload="sessions:users=3,turns=2:5,think=0.05,user=16,output=4",
        number=(25,),
    )
    assert result.status == "completed"
    (level,) = result.stages
    assert level.label == "3 users"
    assert level.sent == 25
    lines = _lines(result)
    assert len(lines) == 25
    # Never more than 3 turns in flight: one per user.
    events = sorted(
        [(x["sent_s"], 1) for x in lines] + [(x["end_s"], -1) for x in lines]
    )
    depth = deepest = 0
    for _, step in events:
        depth += step
        deepest = max(deepest, depth)
    assert deepest <= 3
    sessions = {x["session"] for x in lines}
    assert level.sessions == len(sessions)
    assert level.sessions is not None
    assert level.sessions >= 25 // 5
