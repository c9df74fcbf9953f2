"""The engine model, driven step by step through ``schedule()`` and ``apply()``.

No event loop runs the engine here: each test plays the step loop itself, so the
checks are about scheduling decisions, not timing.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import pytest

from servemon.simulator.engine import Engine, EngineArgs, Request
from servemon.simulator.profiles import load_profile

TINY = load_profile("tiny")
QWEN = load_profile("qwen3-0.6b-eager")

DEFAULT_ARGS = EngineArgs(
    max_num_seqs=256,
    max_num_batched_tokens=2048,
    num_gpu_blocks=4096,
    block_size=16,
    max_model_len=4096,
    enable_prefix_caching=True,
    eos_probability=0.0,
    seed=0,
)

Plan = list[tuple[Request, int]]


def make_engine(**overrides: object) -> Engine:
    return Engine(TINY, dataclasses.replace(DEFAULT_ARGS, **overrides))


def tokens(n: int, offset: int = 0) -> list[int]:
    return list(range(offset, offset + n))


def drive(
    engine: Engine,
    *,
    max_steps: int = 5_000,
    before: Callable[[Engine], None] | None = None,
    after: Callable[[Engine, Plan], None] | None = None,
) -> int:
    """Step until no request is left; return the number of steps."""
    now = time.monotonic()
    for step in range(max_steps):
        if not engine.running and not engine.waiting:
            return step
        if before is not None:
            before(engine)
        plan = engine.schedule()
        assert plan, "the scheduler made no progress"
        if after is not None:
            after(engine, plan)
        now += engine.step_seconds(plan)
        engine.apply(plan, now)
    pytest.fail(f"the engine did not drain in {max_steps} steps")


def step(engine: Engine) -> Plan:
    plan = engine.schedule()
    engine.apply(plan, time.monotonic())
    return plan


# -- batching ------------------------------------------------------------------


def test_chunked_prefill_splits_a_long_prompt_over_steps() -> None:
    engine = make_engine(max_num_batched_tokens=64)
    req = engine.add_request("a", tokens(200), max_tokens=3)
    chunks = []
    for _ in range(3):
        (planned,) = step(engine)
        assert planned[0] is req
        chunks.append(planned[1])
        assert req.num_output == 0  # still prefilling
    (planned,) = step(engine)
    chunks.append(planned[1])
    assert chunks == [64, 64, 64, 8]
    assert req.num_computed == 200
    assert req.num_output == 1
    assert [n for _, n in step(engine)] == [1]  # then one decode token per step


def test_prefill_chunks_share_the_budget_with_other_requests() -> None:
    engine = make_engine(max_num_batched_tokens=64)
    a = engine.add_request("a", tokens(100), max_tokens=4)
    b = engine.add_request("b", tokens(100, 1000), max_tokens=4)
    assert [(r.request_id, n) for r, n in step(engine)] == [("a", 64)]
    assert [(r.request_id, n) for r, n in step(engine)] == [("a", 36), ("b", 28)]
    assert a.num_output == 1
    assert b.num_output == 0
    budgets: list[int] = []
    drive(engine, after=lambda _e, plan: budgets.append(sum(n for _, n in plan)))
    assert max(budgets) <= 64
    assert a.num_output == b.num_output == 4


def test_every_step_obeys_max_num_batched_tokens() -> None:
    engine = make_engine(max_num_batched_tokens=100)
    for i in range(12):
        engine.add_request(str(i), tokens(37 + 11 * i, 1000 * i), max_tokens=8)
    totals: list[int] = []
    drive(engine, after=lambda _e, plan: totals.append(sum(n for _, n in plan)))
    assert max(totals) == 100  # the budget is used up while prompts wait...
    assert all(t <= 100 for t in totals)  # ...and never exceeded
    assert engine.stats.finished["length"] == 12


def test_max_num_seqs_caps_the_running_batch() -> None:
    engine = make_engine(max_num_seqs=2)
    reqs = [
        engine.add_request(str(i), tokens(10, 100 * i), max_tokens=5) for i in range(5)
    ]
    step(engine)
    assert len(engine.running) == 2
    assert len(engine.waiting) == 3
    running: list[int] = []
    drive(engine, after=lambda e, _plan: running.append(len(e.running)))
    assert max(running) == 2
    assert all(r.num_output == 5 for r in reqs)
    # First come, first served: each pair is scheduled before the next.
    order = sorted(reqs, key=lambda r: r.scheduled_s or 0.0)
    assert [r.request_id for r in order] == ["0", "1", "2", "3", "4"]


# -- preemption ----------------------------------------------------------------


def test_the_newest_running_request_is_preempted_when_blocks_run_out() -> None:
    # 8 blocks of 4 tokens; three requests each grow to 16 tokens (4 blocks).
    engine = make_engine(num_gpu_blocks=8, block_size=4)
    reqs = [
        engine.add_request(str(i), tokens(6, 100 * i), max_tokens=10, ignore_eos=True)
        for i in range(3)
    ]
    seen: list[list[Request]] = []
    before_running: list[Request] = []

    def remember(e: Engine) -> None:
        before_running[:] = e.running

    def check(e: Engine, plan: Plan) -> None:
        kept = len(e.running)
        victims = before_running[kept:]
        if not victims:
            return
        assert e.running == before_running[:kept]  # the oldest stay
        assert list(e.waiting)[: len(victims)] == victims  # back to the front
        assert all(v.blocks == [] and v.num_computed == 0 for v in victims)
        assert all(v not in [r for r, _ in plan] for v in victims)
        seen.append(victims)

    drive(engine, before=remember, after=check)
    assert seen, "no preemption happened"
    assert engine.stats.preemptions == sum(len(v) for v in seen)
    assert engine.stats.preemptions > 0
    # The preempted requests recomputed and still finished in full.
    for req in reqs:
        assert req.finish_reason == "length"
        assert req.num_output == 10
        assert len(req.pieces) == 10
    assert engine.stats.finished == {"length": 3}
    assert engine.pool.usage() == 0.0


def test_preemption_never_exceeds_the_pool() -> None:
    engine = make_engine(num_gpu_blocks=10, block_size=4)
    for i in range(6):
        engine.add_request(str(i), tokens(5, 100 * i), max_tokens=30, ignore_eos=True)

    def check(e: Engine, _plan: Plan) -> None:
        held = sum(len(r.blocks) for r in e.running)
        assert held <= 10
        assert all(r.blocks == [] for r in e.waiting)

    drive(engine, after=check)
    assert engine.stats.preemptions > 0
    assert engine.stats.finished == {"length": 6}


def test_a_preempted_request_is_counted_in_the_prefix_cache_once() -> None:
    # vLLM counts a preempted request's second lookup apart (its "preempted"
    # queries), and its answer reports the first admission's cached tokens.
    engine = make_engine(num_gpu_blocks=8, block_size=4)
    reqs = [
        engine.add_request(str(i), tokens(6, 100 * i), max_tokens=10, ignore_eos=True)
        for i in range(3)
    ]
    drive(engine)
    assert engine.stats.preemptions > 0
    assert any(r.num_preemptions for r in reqs)
    assert engine.stats.prefix_queries == 3 * 6
    assert [r.cached_tokens for r in reqs] == [0, 0, 0]


# -- admission ---------------------------------------------------------------------


def test_a_waiting_request_is_admitted_only_when_its_whole_prompt_fits() -> None:
    # 9 blocks of 4 tokens and a budget of 8 tokens a step. The first request
    # holds 3 blocks, then 4; the second's 28-token prompt needs 7 blocks: its
    # first chunk (2 blocks) would fit at once, but vLLM waits until all 7 are free.
    engine = make_engine(num_gpu_blocks=9, block_size=4, max_num_batched_tokens=8)
    first = engine.add_request("a", tokens(8), max_tokens=8, ignore_eos=True)
    step(engine)
    second = engine.add_request("b", tokens(28, 100), max_tokens=1, ignore_eos=True)
    admitted_at = None
    for n in range(40):
        plan = step(engine)
        if admitted_at is None and any(r is second for r, _ in plan):
            admitted_at = n
            assert first.finished
            assert [new for r, new in plan if r is second] == [8]  # a first chunk
        if not engine.running and not engine.waiting:
            break
    assert admitted_at is not None
    assert engine.stats.preemptions == 0
    assert second.num_output == 1


# -- prefix caching --------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt_len", "cached"),
    [(50, 48), (48, 32), (16, 0), (17, 16)],
)
def test_a_repeated_prompt_hits_its_full_blocks(prompt_len: int, cached: int) -> None:
    engine = make_engine()
    first = engine.add_request("a", tokens(prompt_len), max_tokens=2)
    drive(engine)
    assert first.cached_tokens == 0
    second = engine.add_request("b", tokens(prompt_len), max_tokens=2)
    (planned,) = step(engine)
    assert second.cached_tokens == cached
    assert planned == (second, prompt_len - cached)  # at least one recomputed
    assert engine.stats.prefix_hits == cached
    assert engine.stats.prefix_queries == 2 * prompt_len
    drive(engine)
    assert second.num_output == 2


def test_a_running_request_shares_its_prefix_blocks() -> None:
    engine = make_engine()
    first = engine.add_request("a", tokens(40), max_tokens=50)
    step(engine)  # prefilled: two full blocks keyed
    second = engine.add_request("b", [*tokens(32), 7, 7, 7], max_tokens=5)
    step(engine)
    assert second.cached_tokens == 32
    assert second.blocks[:2] == first.blocks[:2]
    used = engine.pool.num_blocks - engine.pool.num_free
    assert used == len(first.blocks) + len(second.blocks) - 2
    engine.abort(first)
    assert engine.pool.num_blocks - engine.pool.num_free == len(second.blocks)


def test_a_different_prompt_gets_no_hits() -> None:
    engine = make_engine()
    engine.add_request("a", tokens(64), max_tokens=1)
    drive(engine)
    req = engine.add_request("b", tokens(64, 5000), max_tokens=1)
    drive(engine)
    assert req.cached_tokens == 0
    assert engine.stats.prefix_hits == 0


def test_prefix_caching_off_gives_no_hits() -> None:
    engine = make_engine(enable_prefix_caching=False)
    for name in ("a", "b", "c"):
        engine.add_request(name, tokens(100), max_tokens=2)
        drive(engine)
    assert engine.stats.prefix_hits == 0
    assert engine.pool.num_cached == 0


# -- output length and EOS -------------------------------------------------------


def test_output_length_is_max_tokens_without_eos() -> None:
    engine = make_engine(eos_probability=0.0)
    reqs = [engine.add_request(str(n), tokens(8), max_tokens=n) for n in (1, 7, 33)]
    drive(engine)
    for req in reqs:
        assert req.num_output == req.max_tokens
        assert len(req.pieces) == len(req.token_s) == req.max_tokens
        assert req.finish_reason == "length"
    assert engine.stats.generation_tokens == 1 + 7 + 33


def run_eos(seed: int) -> list[tuple[int, str | None]]:
    engine = make_engine(eos_probability=0.05, seed=seed)
    reqs = [engine.add_request(str(i), tokens(8, i), max_tokens=40) for i in range(30)]
    drive(engine)
    return [(r.num_output, r.finish_reason) for r in reqs]


def test_seeded_eos_is_deterministic_and_sets_the_finish_reason() -> None:
    outcome = run_eos(seed=7)
    assert outcome == run_eos(seed=7)
    assert outcome != run_eos(seed=8)
    reasons = {reason for _, reason in outcome}
    assert reasons == {"stop", "length"}
    for n, reason in outcome:
        if reason == "length":
            assert n == 40
        else:
            assert 1 <= n < 40


def test_ignore_eos_and_min_tokens() -> None:
    engine = make_engine(eos_probability=1.0)
    eos = engine.add_request("eos", tokens(8), max_tokens=20)
    floor = engine.add_request("min", tokens(8), max_tokens=20, min_tokens=5)
    full = engine.add_request("full", tokens(8), max_tokens=20, ignore_eos=True)
    drive(engine)
    assert (eos.num_output, eos.finish_reason) == (1, "stop")
    assert (floor.num_output, floor.finish_reason) == (5, "stop")
    assert (full.num_output, full.finish_reason) == (20, "length")


# -- abort -----------------------------------------------------------------------


def test_abort_frees_blocks_at_once() -> None:
    engine = make_engine()
    keep = engine.add_request("keep", tokens(40), max_tokens=100)
    gone = engine.add_request("gone", tokens(40, 1000), max_tokens=100)
    for _ in range(5):
        step(engine)
    assert len(gone.blocks) == 3
    engine.abort(gone)
    assert gone.blocks == []
    assert gone.finish_reason == "abort"
    assert gone not in engine.running
    assert engine.pool.num_blocks - engine.pool.num_free == len(keep.blocks)
    engine.abort(keep)
    assert engine.pool.usage() == 0.0
    assert engine.stats.finished == {"abort": 2}
    engine.abort(keep)  # a second abort is a no-op
    assert engine.stats.finished == {"abort": 2}


def test_abort_during_a_step_and_while_waiting() -> None:
    engine = make_engine(max_num_seqs=1)
    running = engine.add_request("run", tokens(20), max_tokens=10)
    waiting = engine.add_request("wait", tokens(20, 100), max_tokens=10)
    plan = engine.schedule()
    assert [r for r, _ in plan] == [running]
    engine.abort(running)  # the client goes away mid-step
    engine.abort(waiting)
    engine.apply(plan, time.monotonic())
    assert running.num_output == 0
    assert not engine.running
    assert not engine.waiting
    assert engine.pool.usage() == 0.0
    assert engine.stats.finished == {"abort": 2}


def test_capacity_error_refuses_what_can_never_fit() -> None:
    engine = make_engine(max_model_len=100, num_gpu_blocks=4, block_size=16)
    assert engine.capacity_error(50, 14) is None
    too_long = engine.capacity_error(90, 20)
    assert too_long is not None
    assert "maximum context length is 100" in too_long
    too_big = engine.capacity_error(60, 20)
    assert too_big is not None
    assert "5 KV cache blocks" in too_big


# -- the cost model ----------------------------------------------------------------


def decode_plan(
    engine: Engine, batch: int, context: int
) -> Sequence[tuple[Request, int]]:
    reqs = [
        engine.add_request(str(i), tokens(context), max_tokens=1) for i in range(batch)
    ]
    for req in reqs:
        req.num_computed = context
    return [(req, 1) for req in reqs]


def test_tiny_profile_steps_take_one_to_two_ms() -> None:
    engine = make_engine()
    decode = engine.step_seconds(decode_plan(engine, 1, 128))
    assert 0.001 <= decode <= 0.002
    batch = engine.step_seconds(decode_plan(engine, 16, 256))
    assert 0.001 <= batch <= 0.002
    prefill = TINY.step_seconds(tokens=128, kv_tokens_read=0, seqs=1)
    assert decode < prefill <= 0.002


def test_qwen_eager_decode_step_is_about_28_ms_and_flat() -> None:
    engine = Engine(QWEN, dataclasses.replace(DEFAULT_ARGS, num_gpu_blocks=5000))
    single = engine.step_seconds(decode_plan(engine, 1, 192))
    assert 0.026 <= single <= 0.029
    eight = engine.step_seconds(decode_plan(engine, 8, 256))
    assert 0.026 <= eight <= 0.030
    assert eight < 1.1 * single  # eager overhead dominates: TPOT nearly flat


def test_speed_scales_step_time() -> None:
    engine = make_engine()
    plan = decode_plan(engine, 1, 64)
    normal = engine.step_seconds(plan)
    engine.speed = 0.25
    assert engine.step_seconds(plan) == pytest.approx(4 * normal)
