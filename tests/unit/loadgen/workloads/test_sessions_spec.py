"""Sessions workloads, model mixes and reasoning, without a server: specs (a bad
one named in one line), what a session holds, how a mix draws, how the record
groups requests by turn and by model, and how a stream's reasoning is told from
its answer."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from servemon.core.errors import ConfigError
from servemon.loadgen.record.line import request_line, timing_from_line
from servemon.loadgen.record.runrecord import (
    RunSummary,
    StageResult,
    _summary_input,
)
from servemon.loadgen.record.tally import Tally
from servemon.loadgen.send.client import _Probe, server_facts
from servemon.loadgen.send.timing import Outcome, RequestTiming
from servemon.loadgen.workloads.modelmix import parse_model
from servemon.loadgen.workloads.promptfile import read_conversations
from servemon.loadgen.workloads.sessions import (
    SessionWorkload,
    parse_sessions,
    parse_think,
)
from servemon.loadgen.workloads.workload import build_workload, parse_workload

if TYPE_CHECKING:
    from servemon.loadgen.run.plan import Kind, Plan


class WordCounter:
    """One token a word (the simulator's tokenizer on plain words)."""

    source = "fake"

    async def count(self, text: str) -> int:
        return len(text.split())


def sessions(spec: str, seed: int = 0) -> SessionWorkload:
    built = asyncio.run(
        build_workload(parse_workload(spec), counter=WordCounter(), seed=seed)
    )
    assert isinstance(built, SessionWorkload)
    return built


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("sessions:turns=0", "turns must be N or A:B"),
        ("sessions:turns=3:2", "turns must be N or A:B"),
        ("sessions:think=exp:-1", "think must be"),
        ("sessions:think=gamma:1", "think must be"),
        ("sessions:think=uniform:2:1", "think must be"),
        ("sessions:colour=red", "unknown key 'colour'"),
        ("sessions:user=8,user=9", "'user' given twice"),
        ("sessions:answer=file", "answer must be own, filler or (with file=) file"),
        ("sessions:users=2:4", "users must be one integer"),
        ("sessions:system=140000", "system=140000: at most"),
        ("sessions:file=x.jsonl,turns=3", "come from the file"),
    ],
)
def test_a_bad_sessions_spec_is_one_line_naming_the_key(
    spec: str, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_workload(spec).check()
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_think_times_follow_their_distribution() -> None:
    rng = random.Random(1)
    assert parse_think("1.5").draw(rng) == 1.5
    draws = [parse_think("exp:2").draw(rng) for _ in range(4000)]
    assert sum(draws) / len(draws) == pytest.approx(2.0, rel=0.08)
    uniform = [parse_think("uniform:1:3").draw(rng) for _ in range(1000)]
    assert min(uniform) >= 1
    assert max(uniform) <= 3
    lognormal = sorted(parse_think("lognormal:2:0.5").draw(rng) for _ in range(2001))
    assert lognormal[1000] == pytest.approx(2.0, rel=0.1)  # the median
    assert str(parse_think("exp:2")) == "exp:2"


def test_a_session_is_the_same_for_the_same_seed_and_differs_between_sessions() -> None:
    spec = "sessions:turns=2:5,think=exp:1,system=64,first=200,user=10:20,output=7"
    a, b = sessions(spec), sessions(spec)
    assert a.session(3) == b.session(3)
    assert a.session(3) != a.session(4)
    counts = Counter(len(a.session(i).turns) for i in range(200))
    assert set(counts) == {2, 3, 4, 5}
    session = a.session(7)
    assert session.system is not None
    assert len(session.system.split()) == 64
    assert session.system == a.session(8).system  # one system prompt, shared
    first, *rest = session.turns
    assert first.think_s == 0
    assert first.user_tokens == 200
    assert len(first.user.split()) == 200
    for turn in rest:
        assert turn.think_s >= 0
        assert 10 <= (turn.user_tokens or 0) <= 20
        assert len(turn.user.split()) == turn.user_tokens
        assert turn.max_tokens == 7
    # Every user message is new text: the cache can only serve the history.
    texts = [t.user for i in range(20) for t in a.session(i).turns]
    assert len(set(texts)) == len(texts)
    # prompt(i), the one-request view, is the first turn after the system prompt.
    prompt = a.prompt(7)
    assert prompt.messages is not None
    assert [m["role"] for m in prompt.messages] == ["system", "user"]
    assert prompt.prompt_tokens == 264


def test_sharegpt_conversations_become_sessions_turn_by_turn(tmp_path: Path) -> None:
    path = tmp_path / "chats.jsonl"
    lines = [
        {
            "system": "be brief",
            "conversations": [
                {"from": "human", "value": "one two three"},
                {"from": "gpt", "value": "four five"},
                {"from": "human", "value": "six"},
                {"from": "gpt", "value": "seven eight nine ten"},
            ],
        },
        {"conversations": [{"from": "gpt", "value": "no question"}]},  # skipped
        {"conversations": [{"from": "human", "value": "alone"}]},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    built = sessions(f"sessions:file={path},answer=file,think=0")
    first = built.session(0)
    assert first.system == "be brief"
    assert first.system_tokens == 2
    assert [(t.user, t.answer, t.max_tokens) for t in first.turns] == [
        ("one two three", "four five", 2),
        ("six", "seven eight nine ten", 4),
    ]
    assert built.session(1).turns[0].user == "alone"
    assert built.session(1).turns[0].max_tokens == 128  # no reply: the default
    assert built.session(2).turns == built.session(0).turns  # the file, cycled

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(lines[0]) + "\n" + '{"conversations": [{"from": 1}]}\n')
    with pytest.raises(ConfigError) as caught:
        read_conversations(bad)
    assert "line 2: conversations[0]" in str(caught.value)


def test_a_model_mix_draws_by_weight_and_the_same_for_the_same_seed() -> None:
    mix = parse_model("base=0.7, lora-a=0.2,lora-b=0.1")
    assert mix is not None
    draws = Counter(mix.draw(3, i) for i in range(5000))
    assert draws["base"] / 5000 == pytest.approx(0.7, abs=0.03)
    assert draws["lora-b"] / 5000 == pytest.approx(0.1, abs=0.02)
    assert [mix.draw(3, i) for i in range(50)] == [mix.draw(3, i) for i in range(50)]
    assert parse_model("Qwen/Qwen3-0.6B") is None  # one plain model
    assert str(mix) == "base=0.7,lora-a=0.2,lora-b=0.1"
    for text, message in (
        ("a=0.5,b", "expected NAME=WEIGHT"),
        ("a=0,b=1", "a: the weight must be a number > 0"),
        ("a=x", "a: the weight must be a number > 0, got 'x'"),
        ("a=1,a=2", "'a' given twice"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse_model(text)


def request(
    i: int, *, turn: int | None = None, model: str | None = None, ttft: float = 0.1
) -> RequestTiming:
    sent = 10.0 + i
    return RequestTiming(
        request_id=str(i),
        scheduled_s=sent,
        sent_s=sent,
        end_s=sent + 1.0,
        outcome=Outcome.OK,
        first_chunk_s=sent + 0.01,
        content_s=(sent + ttft, sent + 0.5),
        first_answer_s=sent + ttft + 0.2,
        output_tokens=2,
        prompt_tokens=100,
        cached_tokens=50 if turn and turn > 1 else 0,
        reasoning_tokens=1,
        model=model,
        session="s" if turn else None,
        turn=turn,
        history_tokens=None if turn is None else (turn - 1) * 40,
    )


def test_the_record_groups_requests_by_turn_and_by_model(tmp_path: Path) -> None:
    tally = Tally()
    for i in range(12):
        tally.add(request(i, turn=i % 3 + 1, model="a" if i % 4 else "b", ttft=0.1))
    tally.add(request(12))  # says neither: in no group
    stages, overall = tally.results([StageResult(0, "1 sessions/s", 1.0)], [None])
    summary = RunSummary("ramp", "completed", stages, overall, **tally.groups())
    assert summary.by_turn is not None
    assert summary.by_model is not None
    assert list(summary.by_turn) == ["1", "2", "3"]
    assert {k: v.requests for k, v in summary.by_model.items()} == {"a": 9, "b": 3}
    assert summary.by_turn["1"].cached_fraction == 0
    assert summary.by_turn["2"].cached_fraction == 0.5
    assert summary.by_turn["3"].mean_history_tokens == 80
    ttfa = summary.by_turn["1"].figure("ttfa")
    assert ttfa is not None
    assert ttfa.p50 == pytest.approx(0.3)
    assert overall.mean_reasoning_tokens == 1
    # Through the JSON and back, and in the CSV's rows.
    data = json.loads(json.dumps(summary.to_json()))
    back = _summary_input(data)
    assert back["by_turn"]["2"].cached_fraction == 0.5
    assert [r["stage"] for r in summary.csv_rows()][-5:] == [
        "turn 1",
        "turn 2",
        "turn 3",
        "model a",
        "model b",
    ]
    # A requests.jsonl line keeps what the groups need.
    line = json.loads(json.dumps(request_line(request(5, turn=2, model="a"))))
    again = timing_from_line(line)
    assert (again.turn, again.model, again.session, again.history_tokens) == (
        2,
        "a",
        "s",
        40,
    )
    assert again.ttfa == pytest.approx(0.3)
    assert "text" not in line


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_deltas_are_tokens_but_not_the_answer(field: str) -> None:
    probe = _Probe("r", 0.0)
    probe.sent_s = 0.0
    probe.text = []
    events = [
        ({"choices": [{"delta": {"role": "assistant", "content": ""}}]}, 0.01),
        ({"choices": [{"delta": {field: "hmm"}}]}, 0.1),
        ({"choices": [{"delta": {field: " let me see"}}]}, 0.2),
        ({"choices": [{"delta": {"content": "Yes"}}]}, 0.5),
        ({"choices": [{"delta": {"content": "."}, "finish_reason": "stop"}]}, 0.6),
    ]
    for event, at in events:
        probe.take_event(event, at)
    usage = {
        "prompt_tokens": 5,
        "completion_tokens": 4,
        "completion_tokens_details": {"reasoning_tokens": 2},
    }
    probe.take_event({"choices": [], "usage": usage}, 0.61)
    probe.done_s = 0.62
    timing = probe.result()
    assert timing.ttft == pytest.approx(0.1)  # the first token of any kind
    assert timing.ttfa == pytest.approx(0.5)  # the first token of the answer
    assert timing.reasoning_tokens == 2
    assert timing.text == "Yes."  # the answer alone goes back in a conversation


def test_reasoning_tokens_are_read_only_where_usage_gives_a_count() -> None:
    def reasoning(usage: dict[str, object]) -> object:
        return server_facts(usage, None, None).get("reasoning_tokens")

    assert reasoning({"completion_tokens_details": {"reasoning_tokens": 7}}) == 7
    assert reasoning({"completion_tokens_details": {"reasoning_tokens": -1}}) is None
    assert reasoning({"completion_tokens_details": {"reasoning_tokens": "7"}}) is None
    assert reasoning({"completion_tokens_details": None}) is None
    assert reasoning({}) is None


def test_a_model_that_does_not_reason_has_its_answer_at_its_first_token() -> None:
    probe = _Probe("r", 0.0)
    probe.sent_s = 0.0
    probe.take_event({"choices": [{"delta": {"content": "Hi"}}]}, 0.2)
    probe.take_event({"choices": [{"delta": {}, "finish_reason": "stop"}]}, 0.3)
    timing = probe.result()
    assert timing.ttft == timing.ttfa == pytest.approx(0.2)
    assert timing.text is None  # not kept unless asked


def test_the_users_of_a_sweep_come_from_one_place() -> None:
    from servemon.loadgen.run.flat import config_of
    from servemon.loadgen.run.plan import make_plan

    def plan(kind: Kind, **flags: object) -> Plan:
        return make_plan(kind, config_of(kind, ("flags", flags)))

    six = "sessions:users=6"
    assert [s.label for s in plan("sweep", workload=six).stages] == ["6 users"]
    with pytest.raises(ConfigError, match="both set the users"):
        plan("sweep", workload=six, parallel=(2,))
    with pytest.raises(ConfigError, match="run it with servemon sweep"):
        plan("ramp", workload=six)
    with pytest.raises(ConfigError, match="--warmup"):
        plan("sweep", workload="sessions:", warmup=2)
    ramp = plan("ramp", workload="sessions:", stages="2:5")
    assert [s.label for s in ramp.stages] == ["2 sessions/s"]
    assert parse_sessions("", 128).users is None
