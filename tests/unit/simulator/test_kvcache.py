"""BlockPool: reference counts, the prefix hash chain, LRU eviction, usage."""

from __future__ import annotations

import pytest

from servemon.simulator.kvcache import BlockPool, prompt_block_hashes

BLOCK = 4


def keyed_blocks(pool: BlockPool, tokens: list[int]) -> tuple[list[int], list[int]]:
    """Allocate blocks for ``tokens`` and key the full ones, as the engine does."""
    keys = prompt_block_hashes(tokens, pool.block_size)
    blocks = pool.allocate(pool.blocks_for(len(tokens)))
    for block, key in zip(blocks, keys, strict=False):
        pool.cache(block, key)
    return blocks, keys


def test_allocate_and_free_track_usage() -> None:
    pool = BlockPool(num_blocks=8, block_size=BLOCK)
    assert pool.usage() == 0.0
    blocks = pool.allocate(3)
    assert len(set(blocks)) == 3
    assert pool.num_free == 5
    assert pool.usage() == pytest.approx(3 / 8)
    pool.free(blocks)
    assert pool.num_free == 8
    assert pool.usage() == 0.0


def test_allocate_more_than_free_is_refused() -> None:
    pool = BlockPool(num_blocks=4, block_size=BLOCK)
    pool.allocate(3)
    with pytest.raises(ValueError, match="asked for 2 blocks, 1 free"):
        pool.allocate(2)
    assert pool.num_free == 1


def test_blocks_for_rounds_up() -> None:
    pool = BlockPool(num_blocks=4, block_size=16)
    assert [pool.blocks_for(n) for n in (0, 1, 16, 17, 32, 33)] == [0, 1, 1, 2, 2, 3]


def test_shared_block_is_released_by_its_last_holder() -> None:
    pool = BlockPool(num_blocks=4, block_size=BLOCK)
    blocks, keys = keyed_blocks(pool, list(range(8)))
    hits = pool.lookup(keys)
    assert hits == blocks
    pool.take(hits)  # a second request holds the same two blocks
    assert pool.usage() == pytest.approx(2 / 4)
    pool.free(blocks)  # the first lets go: still held by the second
    assert pool.num_free == 2
    assert pool.usage() == pytest.approx(2 / 4)
    pool.free(hits)
    assert pool.num_free == 4
    assert pool.usage() == 0.0


def test_hash_chain_covers_only_full_blocks() -> None:
    assert prompt_block_hashes(list(range(3)), BLOCK) == []
    assert len(prompt_block_hashes(list(range(4)), BLOCK)) == 1
    assert len(prompt_block_hashes(list(range(11)), BLOCK)) == 2
    assert len(prompt_block_hashes(list(range(12)), BLOCK)) == 3


def test_hash_chain_keys_depend_on_everything_before() -> None:
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    keys = prompt_block_hashes(tokens, BLOCK)
    assert keys == prompt_block_hashes(list(tokens), BLOCK)  # deterministic
    assert len(set(keys)) == 3
    # Same second and third blocks after a different first block: no key shared.
    changed = prompt_block_hashes([0, *tokens[1:]], BLOCK)
    assert not set(changed) & set(keys)
    # A change in the last block keeps the keys of the blocks before it.
    tail = prompt_block_hashes([*tokens[:-1], 99], BLOCK)
    assert tail[:2] == keys[:2]
    assert tail[2] != keys[2]
    # The same block content at another position has another key.
    repeated = prompt_block_hashes([1, 2, 3, 4, 1, 2, 3, 4], BLOCK)
    assert repeated[0] != repeated[1]


def test_lookup_returns_the_longest_cached_run_from_the_start() -> None:
    pool = BlockPool(num_blocks=8, block_size=BLOCK)
    tokens = list(range(12))
    blocks, keys = keyed_blocks(pool, tokens)
    assert pool.lookup(keys) == blocks
    assert pool.lookup(keys[:2]) == blocks[:2]
    other = prompt_block_hashes([*tokens[:4], 50, 51, 52, 53], BLOCK)
    assert pool.lookup(other) == blocks[:1]
    assert pool.lookup(prompt_block_hashes([9, 9, 9, 9], BLOCK)) == []
    # A gap stops the run even if later keys are cached.
    assert pool.lookup([keys[0], 12345, keys[2]]) == blocks[:1]


def test_cache_keeps_the_first_block_for_a_key() -> None:
    pool = BlockPool(num_blocks=4, block_size=BLOCK)
    first, keys = keyed_blocks(pool, list(range(4)))
    second, _ = keyed_blocks(pool, list(range(4)))
    assert first != second
    assert pool.lookup(keys) == first
    assert pool.num_cached == 1


def test_eviction_takes_fresh_blocks_then_oldest_freed_tail_first() -> None:
    pool = BlockPool(num_blocks=6, block_size=BLOCK)
    a_blocks, a_keys = keyed_blocks(pool, list(range(12)))  # 3 blocks
    pool.free(a_blocks)
    assert pool.num_cached == 3
    assert pool.usage() == 0.0
    # The three never-used blocks were freed earlier than A's: they go first.
    fresh = pool.allocate(3)
    assert not set(fresh) & set(a_blocks)
    assert pool.lookup(a_keys) == a_blocks
    # Then A's blocks, tail first: its prefix head survives longest.
    assert pool.allocate(1) == [a_blocks[2]]
    assert pool.lookup(a_keys) == a_blocks[:2]
    assert pool.allocate(1) == [a_blocks[1]]
    assert pool.lookup(a_keys) == a_blocks[:1]
    assert pool.num_cached == 1


def test_eviction_order_is_least_recently_freed_first() -> None:
    pool = BlockPool(num_blocks=4, block_size=BLOCK)
    a_blocks, a_keys = keyed_blocks(pool, [1, 1, 1, 1, 2, 2, 2, 2])
    b_blocks, b_keys = keyed_blocks(pool, [3, 3, 3, 3, 4, 4, 4, 4])
    pool.free(a_blocks)
    pool.free(b_blocks)
    # A was freed first, so A goes first, even though B was allocated later.
    assert pool.allocate(2) == [a_blocks[1], a_blocks[0]]
    assert pool.lookup(a_keys) == []
    assert pool.lookup(b_keys) == b_blocks


def test_a_freed_block_without_a_key_is_reused_before_any_cached_one() -> None:
    # vLLM's BlockPool.free_blocks: blocks no request can hit go to the front of
    # the free queue, cached ones to its end.
    pool = BlockPool(num_blocks=6, block_size=BLOCK)
    a_blocks, a_keys = keyed_blocks(pool, list(range(10)))  # 2 full + 1 partial
    pool.free(a_blocks)
    assert pool.allocate(1) == [a_blocks[2]]  # the partial one, before fresh ones
    fresh = pool.allocate(3)
    assert not set(fresh) & set(a_blocks)
    assert pool.lookup(a_keys) == a_blocks[:2]


def test_taking_a_cached_block_protects_it_from_eviction() -> None:
    pool = BlockPool(num_blocks=4, block_size=BLOCK)
    a_blocks, a_keys = keyed_blocks(pool, list(range(8)))
    pool.free(a_blocks)
    pool.take(pool.lookup(a_keys))  # a new request reuses A's prefix
    assert pool.num_free == 2
    fresh = pool.allocate(2)
    assert not set(fresh) & set(a_blocks)
    assert pool.lookup(a_keys) == a_blocks
    with pytest.raises(ValueError, match="asked for 1 blocks, 0 free"):
        pool.allocate(1)


def test_usage_returns_to_zero_with_cached_blocks() -> None:
    pool = BlockPool(num_blocks=8, block_size=BLOCK)
    a_blocks, _ = keyed_blocks(pool, list(range(16)))
    b_blocks, _ = keyed_blocks(pool, list(range(100, 116)))
    assert pool.usage() == 1.0
    pool.free(a_blocks)
    pool.free(b_blocks)
    assert pool.num_cached == 8
    assert pool.usage() == 0.0
    assert pool.num_free == 8


def test_can_take_counts_idle_hits_against_free_blocks() -> None:
    pool = BlockPool(num_blocks=8, block_size=BLOCK)
    a_blocks, a_keys = keyed_blocks(pool, list(range(12)))
    pool.free(a_blocks)  # three idle cached blocks, counted as free
    held = pool.allocate(5)  # everything else is held
    assert pool.num_free == 3
    hits = pool.lookup(a_keys)
    assert hits == a_blocks
    # Taking the three idle hits leaves nothing to allocate from.
    assert pool.can_take(hits, 0)
    assert not pool.can_take(hits, 1)
    # Taking two of them leaves one block.
    assert pool.can_take(hits[:2], 1)
    assert not pool.can_take(hits[:2], 2)
    # Without hits the three free blocks can be allocated (evicting the cache).
    assert pool.can_take([], 3)
    assert not pool.can_take([], 4)
    # Hits already held by another request cost nothing from the free list.
    pool.take(hits)
    pool.free(held)
    assert pool.num_free == 5
    assert pool.can_take(hits, 5)
    assert not pool.can_take(hits, 6)


def test_reset_cache_forgets_prefixes_but_not_holders() -> None:
    pool = BlockPool(num_blocks=4, block_size=BLOCK)
    blocks, keys = keyed_blocks(pool, list(range(8)))
    pool.reset_cache()
    assert pool.num_cached == 0
    assert pool.lookup(keys) == []
    assert pool.num_free == 2
    pool.free(blocks)
    assert pool.usage() == 0.0
