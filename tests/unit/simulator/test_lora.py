"""LoRA adapters and reasoning in the engine, stepped by hand (no event loop).

vLLM's V1 scheduler skips a waiting request whose adapter would take the batch past
``max_loras`` distinct adapters, and tries the next; the worker loads an adapter that
is not loaded (least recently used out) before the step that needs it.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from servemon.core.errors import ConfigError
from servemon.simulator.config import SimConfig, merge, parse_reasoning_tokens
from servemon.simulator.engine import Engine, EngineArgs
from servemon.simulator.lora import AdapterCache
from servemon.simulator.profiles import load_profile

TINY = load_profile("tiny")
ARGS = EngineArgs(
    max_num_seqs=256,
    max_num_batched_tokens=2048,
    num_gpu_blocks=4096,
    block_size=16,
    max_model_len=4096,
    enable_prefix_caching=True,
    eos_probability=0.0,
    seed=0,
    lora_modules=("a", "b", "c"),
    max_loras=1,
    max_cpu_loras=1,
    lora_load_s=0.5,
)


def make_engine(**overrides: object) -> Engine:
    return Engine(TINY, dataclasses.replace(ARGS, **overrides))


def prompt(offset: int) -> list[int]:
    return list(range(offset, offset + 8))


def step(engine: Engine) -> list[str]:
    plan = engine.schedule()
    engine.apply(plan, time.monotonic())
    return [req.request_id for req, _ in plan]


# -- the adapter cache -------------------------------------------------------------


def test_the_cache_preloads_in_order_and_evicts_the_least_recently_used() -> None:
    cache = AdapterCache(2, preload=["a", "b", "c"])
    assert cache.loaded == ("b", "c")  # a was loaded, then pushed out
    assert cache.loads == 0
    assert cache.activate(["b"]) == 0
    assert cache.loaded == ("c", "b")
    assert cache.activate(["a"]) == 1  # evicts c, the least recently used
    assert cache.loaded == ("b", "a")
    assert cache.activate(["a", "b"]) == 0
    assert cache.loads == 1


def test_a_cache_holds_at_least_one() -> None:
    with pytest.raises(ValueError, match="capacity"):
        AdapterCache(0)


# -- scheduling under max_loras ----------------------------------------------------


def test_a_second_adapter_waits_while_the_first_runs() -> None:
    engine = make_engine()
    engine.add_request("a1", prompt(0), max_tokens=3, lora="a")
    engine.add_request("b1", prompt(100), max_tokens=3, lora="b")
    engine.add_request("base", prompt(200), max_tokens=3)
    engine.add_request("a2", prompt(300), max_tokens=3, lora="a")
    # b1 is skipped, not a barrier: the base model and a's second request go on.
    assert step(engine) == ["a1", "base", "a2"]
    assert [req.request_id for req in engine.waiting] == ["b1"]
    assert engine.lora_state() == (["a"], ["b"])
    while engine.running:
        step(engine)
    # Only once a's requests are done does b get the batch.
    assert [req.request_id for req in engine.running] == []
    assert step(engine) == ["b1"]
    assert engine.lora_state() == (["b"], [])


def test_max_loras_two_runs_two_adapters_at_once() -> None:
    engine = make_engine(max_loras=2, max_cpu_loras=2)
    for name in ("a", "b", "c"):
        engine.add_request(name, prompt(ord(name)), max_tokens=2, lora=name)
    assert step(engine) == ["a", "b"]
    assert engine.lora_state() == (["a", "b"], ["c"])


def test_a_step_that_must_load_an_adapter_takes_lora_load_s_longer() -> None:
    engine = make_engine()  # a, b, c preloaded into one place: c is loaded
    engine.add_request("c", prompt(0), max_tokens=2, lora="c")
    plan = engine.schedule()
    assert engine.step_load_s == 0.0
    base = engine.step_seconds(plan)
    engine.apply(plan, time.monotonic())
    while engine.running:
        step(engine)
    engine.add_request("a", prompt(50), max_tokens=2, lora="a")
    plan = engine.schedule()
    assert engine.step_load_s == pytest.approx(0.5)
    assert engine.step_seconds(plan) == pytest.approx(base + 0.5, rel=0.2)
    engine.apply(plan, time.monotonic())
    plan = engine.schedule()  # a is loaded now: the next step pays nothing
    assert engine.step_load_s == 0.0
    assert engine.adapters.loaded == ("a",)


def test_the_lora_info_keeps_every_state_with_its_last_time() -> None:
    engine = make_engine()
    engine.add_request("a1", prompt(0), max_tokens=2, lora="a")
    engine.add_request("b1", prompt(100), max_tokens=2, lora="b")
    before = time.time()
    step(engine)
    info = engine.stats.lora_info
    assert list(info) == [("a", "b")]
    assert info[("a", "b")] >= before
    while engine.running or engine.waiting:
        step(engine)
    # a done and b not yet scheduled, b running, then nothing.
    assert list(info) == [("a", "b"), ("", "b"), ("b", ""), ("", "")]
    newest = max(info, key=info.__getitem__)
    assert newest == ("", "")


def test_without_adapters_nothing_is_recorded() -> None:
    engine = make_engine(lora_modules=())
    engine.add_request("x", prompt(0), max_tokens=2)
    step(engine)
    assert not engine.lora_enabled
    assert engine.stats.lora_info == {}


# -- reasoning -----------------------------------------------------------------------


def test_reasoning_is_drawn_per_request_from_the_seed() -> None:
    draws = []
    for _ in range(2):
        engine = make_engine(reasoning_tokens=(2, 9))
        reqs = [engine.add_request(str(i), prompt(i), max_tokens=20) for i in range(40)]
        draws.append([req.reasoning_tokens for req in reqs])
    assert draws[0] == draws[1]
    assert set(draws[0]) <= set(range(2, 10))
    assert len(set(draws[0])) > 3


def test_max_tokens_counts_reasoning_and_answer() -> None:
    engine = make_engine(reasoning_tokens=(8, 8))
    short = engine.add_request("short", prompt(0), max_tokens=5)
    long = engine.add_request("long", prompt(50), max_tokens=12)
    while engine.running or engine.waiting:
        step(engine)
    assert (short.reasoning_tokens, short.num_output) == (5, 5)  # all reasoning
    assert (long.reasoning_tokens, long.num_output) == (8, 12)
    assert long.finish_reason == "length"


def test_an_early_stop_comes_only_after_the_reasoning() -> None:
    engine = make_engine(reasoning_tokens=(6, 6), eos_probability=1.0)
    req = engine.add_request("x", prompt(0), max_tokens=50)
    while engine.running or engine.waiting:
        step(engine)
    assert req.num_output == 7  # six reasoning tokens and one of the answer
    assert req.finish_reason == "stop"


# -- the config's edges ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "pair"), [("0", (0, 0)), ("12", (12, 12)), ("3:9", (3, 9)), (5, (5, 5))]
)
def test_reasoning_tokens_are_n_or_a_range(
    text: str | int, pair: tuple[int, int]
) -> None:
    assert parse_reasoning_tokens(text) == pair


@pytest.mark.parametrize("text", ["-1", "9:3", "1:2:3", "many", ""])
def test_a_bad_reasoning_length_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="expected"):
        parse_reasoning_tokens(text)


def test_names_and_adapters_load_as_vllm_writes_them() -> None:
    config = merge(
        SimConfig(),
        {"served_model_name": "one", "lora_modules": ["sql=/adapters/sql", "chat"]},
        "t",
    )
    assert config.served_model_name == ("one",)
    assert config.lora_modules == ("sql", "chat")


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"max_loras": 2, "max_cpu_loras": 1}, "max_cpu_loras"),
        ({"served_model_name": ["a"], "lora_modules": ["a"]}, "also a served"),
        ({"lora_modules": ["=path"]}, "lora_modules"),
        ({"reasoning_tokens": "5:1"}, "reasoning_tokens"),
        ({"reasoning_field": "thoughts"}, "reasoning_field"),
    ],
)
def test_bad_lora_and_reasoning_config_is_one_line(
    overrides: dict[str, object], says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        merge(SimConfig(), overrides, "sim.yaml")
