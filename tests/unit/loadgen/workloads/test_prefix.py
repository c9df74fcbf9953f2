"""The ``prefix`` workload: its spec, the blocks it chooses, and the hit rate an
ideal prefix cache (vLLM's rules: full blocks, a hash chain, never the last token)
would give its prompts, with counters that count words."""

from __future__ import annotations

from typing import Any

import pytest

from servemon.core.errors import ConfigError
from servemon.loadgen.workloads.prefix import PrefixWorkload, build_prefix
from servemon.loadgen.workloads.prompts import OutputBudget
from servemon.loadgen.workloads.tokens import EstimateCounter
from servemon.loadgen.workloads.workload import build_workload, parse_workload


class WordsCounter:
    """One token a word, two for a word of six letters or more."""

    source = "fake"

    async def count(self, text: str) -> int:
        return sum(1 + len(word) // 6 for word in text.split())


async def prefix(
    hit: float,
    prompt: int = 512,
    *,
    groups: int = 4,
    block_size: int = 16,
    overhead: int = 0,
    tail: int = 0,
    seed: int = 3,
    **kwargs: Any,
) -> PrefixWorkload:
    return await build_prefix(
        f"prefix:hit={hit},prompt={prompt}",
        WordsCounter(),
        seed,
        hit=hit,
        prompt=prompt,
        groups=groups,
        output=OutputBudget(8, 8),
        block_size=block_size,
        overhead_tokens=overhead,
        tail_tokens=tail,
        **kwargs,
    )


def server_tokens(workload: PrefixWorkload, text: str) -> list[str]:
    """What a server would see: template head, the words, template tail."""
    head = [f"<head{i}>" for i in range(workload.overhead_tokens)]
    tail = [f"<tail{i}>" for i in range(workload.tail_tokens)]
    return [*head, *text.split(), *tail]


class IdealCache:
    """vLLM's accounting with room for everything and one request at a time."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.keys: set[int] = set()
        self.queries = self.hits = 0

    def send(self, tokens: list[str]) -> None:
        size = self.block_size
        chain = []
        parent = 0
        for start in range(0, len(tokens) - size + 1, size):
            parent = hash((parent, tuple(tokens[start : start + size])))
            chain.append(parent)
        hit = 0
        for key in chain[: (len(tokens) - 1) // size]:
            if key not in self.keys:
                break
            hit += 1
        self.queries += len(tokens)
        self.hits += hit * size
        self.keys.update(chain)


# --- the spec -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("prefix:prompt=64", "hit is required"),
        ("prefix:hit=1", "hit must be a number with 0 <= hit < 1, got '1'"),
        ("prefix:hit=-0.1", "hit must be a number with 0 <= hit < 1"),
        ("prefix:hit=half", "hit must be a number"),
        ("prefix:hit=nan", "hit must be a number"),
        ("prefix:hit=0.5,prompt=0", "prompt must be an integer >= 1, got '0'"),
        ("prefix:hit=0.5,groups=0", "groups must be an integer >= 1, got '0'"),
        ("prefix:hit=0.5,output=0", "output must be N or A:B"),
        ("prefix:hit=0.5,suffix=3", "unknown key 'suffix' (known: hit, prompt"),
    ],
)
def test_a_bad_spec_is_one_line_naming_the_key(spec: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_workload(spec)
    assert message in str(info.value)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("--workload: prefix: ")


def test_the_spec_has_defaults_but_for_the_rate() -> None:
    spec = parse_workload("prefix:hit=0.6")
    assert spec.kind == "prefix"
    assert spec.options == {
        "hit": 0.6,
        "prompt": 1024,
        "groups": 4,
        "output": OutputBudget(128, 128),
    }


@pytest.mark.asyncio
async def test_the_briefs_example_asks_for_06_and_blocks_give_0_5938() -> None:
    workload = await build_workload(
        parse_workload("prefix:hit=0.6,prompt=1024,output=64"),
        counter=WordsCounter(),
        seed=1,
        block_size=16,
    )
    assert isinstance(workload, PrefixWorkload)
    assert workload.asked_hit == 0.6
    assert workload.expected_hit == pytest.approx(38 * 16 / 1024)
    assert workload.shared_tokens == 38 * 16
    assert workload.prompt(0).max_tokens == 64


# --- the blocks -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hit", "prompt", "block_size", "overhead", "tail"),
    [
        (0.2, 512, 16, 0, 0),
        (0.5, 512, 16, 2, 2),
        (0.8, 512, 16, 0, 0),
        (0.8, 300, 32, 5, 3),
        (0.33, 1000, 16, 17, 5),
        (0.6, 1024, 16, 0, 0),
        (0.1, 2048, 64, 40, 6),
        (0.0, 200, 16, 0, 0),
        (0.05, 200, 16, 4, 2),
    ],
)
@pytest.mark.asyncio
async def test_the_shared_part_is_whole_blocks_and_an_ideal_cache_hits_as_expected(
    hit: float, prompt: int, block_size: int, overhead: int, tail: int
) -> None:
    workload = await prefix(
        hit, prompt, block_size=block_size, overhead=overhead, tail=tail
    )
    total = overhead + prompt + tail
    assert workload.server_tokens == total
    if workload.shared_tokens:
        assert (workload.shared_tokens + overhead) % block_size == 0
        assert workload.shared_tokens + overhead == workload.hit_blocks * block_size
    assert workload.expected_hit == workload.hit_blocks * block_size / total
    assert abs(workload.expected_hit - hit) <= block_size / (2 * total)
    cache = IdealCache(block_size)
    for warm in workload.warm:
        cache.send(server_tokens(workload, warm.text or ""))
    cache.hits = cache.queries = 0
    counter = WordsCounter()
    for index in range(200):
        one = workload.prompt(index)
        assert one.prompt_tokens == prompt
        if index < 8:
            assert await counter.count(one.text or "") == prompt
        cache.send(server_tokens(workload, one.text or ""))
    assert cache.hits / cache.queries == pytest.approx(workload.expected_hit)


@pytest.mark.asyncio
async def test_a_rate_the_blocks_cannot_reach_names_hit() -> None:
    # 64 tokens: 3 blocks at most can hit (the last token is always computed).
    with pytest.raises(ConfigError, match=r"hit=0\.95 .* at most 48 of its 64"):
        await prefix(0.95, 64)
    # A template head of 40 tokens: its 2 full blocks hit in every prompt.
    with pytest.raises(ConfigError, match=r"hit=0\.01 .* first 32 tokens"):
        await prefix(0.01, 100, overhead=40)


@pytest.mark.asyncio
async def test_prefixes_that_would_not_stay_cached_are_refused_naming_groups() -> None:
    # 8 groups of 256 cached tokens: 2048 tokens, over half of 4000.
    with pytest.raises(ConfigError) as info:
        await prefix(0.5, 512, groups=8, cache_tokens=4000)
    assert "groups=8" in str(info.value)
    assert "over half the engine's 4000" in str(info.value)
    assert (await prefix(0.5, 512, groups=7, cache_tokens=4000)).groups == 7


@pytest.mark.asyncio
async def test_the_estimate_cannot_place_block_boundaries() -> None:
    with pytest.raises(ConfigError, match="needs exact token counts"):
        await build_workload(
            parse_workload("prefix:hit=0.5,prompt=100"),
            counter=EstimateCounter(),
            seed=1,
        )


# --- the prompts ----------------------------------------------------------------


@pytest.mark.asyncio
async def test_tails_are_the_requests_own_from_their_first_word() -> None:
    workload = await prefix(0.5, 512, groups=3)
    shared = workload.shared_tokens
    words = [(workload.prompt(i).text or "").split() for i in range(600)]
    for i, one in enumerate(words):
        group = workload.prefixes[i % 3].split()
        assert one[:shared] == group
        if i >= 3:
            assert one[shared] != words[i - 3][shared]  # the group's previous one
    heads = {tuple(one[shared : shared + workload.head_length]) for one in words}
    assert len(heads) == len(words)
    # Groups differ from their first word.
    assert len({one[0] for one in words[:3]}) == 3


@pytest.mark.asyncio
async def test_warm_prompts_share_only_the_prefix() -> None:
    workload = await prefix(0.5, 512, groups=4)
    shared = workload.shared_tokens
    assert len(workload.warm) == 4
    firsts = {(workload.prompt(i).text or "").split()[shared] for i in range(5000)}
    for group, warm in enumerate(workload.warm):
        words = (warm.text or "").split()
        assert words[:shared] == workload.prefixes[group].split()
        assert words[shared] not in firsts
        assert warm.prompt_tokens == 512
        assert warm.max_tokens == 1


@pytest.mark.asyncio
async def test_prompts_are_the_same_for_the_same_seed_and_index() -> None:
    one, two = await prefix(0.5, seed=5), await prefix(0.5, seed=5)
    other = await prefix(0.5, seed=6)
    for index in (0, 1, 17, 10**6):
        assert one.prompt(index) == two.prompt(index)
        assert one.prompt(index).text != other.prompt(index).text
    assert one.warm == two.warm


class CappedCounter:
    """One token a word, but never more than 300: short texts add up, long don't."""

    source = "capped"

    async def count(self, text: str) -> int:
        return min(len(text.split()), 300)


@pytest.mark.asyncio
async def test_counts_that_do_not_add_up_cannot_place_blocks() -> None:
    with pytest.raises(ConfigError, match="do not add up word by word"):
        await build_workload(
            parse_workload("prefix:hit=0.5,prompt=512"), counter=CappedCounter(), seed=1
        )
