"""The paged KV cache: a block pool with prefix caching and LRU eviction.

Blocks hold ``block_size`` tokens. A block whose tokens are all prompt tokens is keyed
by a hash chain over the prompt (each key covers the block and everything before it),
so a later request with the same prefix can reuse it and skip its prefill. A freed
block stays cached until the pool needs it: free blocks are handed out oldest first,
and a request's blocks are freed tail first, so the tail of a prefix goes before its
head, as vLLM does; a freed block with no key (a partial last block) is handed out
before any cached one. A cached block nobody holds counts as free for usage.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["BlockPool", "prompt_block_hashes"]


def prompt_block_hashes(tokens: Sequence[int], block_size: int) -> list[int]:
    """Hash chain keys of every full block of ``tokens``."""
    keys: list[int] = []
    parent = 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[start : start + block_size])))
        keys.append(parent)
    return keys


class BlockPool:
    """A fixed pool of KV blocks with reference counts and a prefix-cache index."""

    __slots__ = ("_free", "_hash_of", "_index", "_refs", "block_size", "num_blocks")

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._refs = [0] * num_blocks
        self._hash_of: list[int | None] = [None] * num_blocks
        self._index: dict[int, int] = {}
        # Blocks with no holder, in eviction order (first = evicted first).
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    @property
    def num_free(self) -> int:
        """Blocks nobody holds, cached or not."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        """Blocks that are keyed in the prefix-cache index."""
        return len(self._index)

    def usage(self) -> float:
        """Fraction of blocks held by requests (0-1), as vLLM reports it."""
        return 1.0 - len(self._free) / self.num_blocks

    def blocks_for(self, tokens: int) -> int:
        """Blocks needed to hold ``tokens`` tokens."""
        return -(-tokens // self.block_size)

    def lookup(self, keys: Sequence[int]) -> list[int]:
        """The cached blocks for the longest run of ``keys`` found from the start."""
        hits: list[int] = []
        for key in keys:
            block = self._index.get(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def can_take(self, hits: Sequence[int], new: int) -> bool:
        """Whether ``hits`` can be held and ``new`` fresh blocks allocated now."""
        idle_hits = sum(1 for block in hits if self._refs[block] == 0)
        return new <= len(self._free) - idle_hits

    def take(self, hits: Sequence[int]) -> None:
        """Hold cached blocks found by :meth:`lookup`."""
        for block in hits:
            if self._refs[block] == 0:
                del self._free[block]
            self._refs[block] += 1

    def allocate(self, count: int) -> list[int]:
        """Hand out ``count`` fresh blocks, evicting cached ones oldest first."""
        if count > len(self._free):
            raise ValueError(f"asked for {count} blocks, {len(self._free)} free")
        blocks: list[int] = []
        for _ in range(count):
            block, _unused = self._free.popitem(last=False)
            key = self._hash_of[block]
            if key is not None:
                del self._index[key]
                self._hash_of[block] = None
            self._refs[block] = 1
            blocks.append(block)
        return blocks

    def cache(self, block: int, key: int) -> None:
        """Key a full prompt block so later requests can reuse it."""
        if key in self._index or self._hash_of[block] is not None:
            return
        self._index[key] = block
        self._hash_of[block] = key

    def free(self, blocks: Sequence[int]) -> None:
        """Release a request's blocks, tail first: keyed blocks to the end of the
        eviction order, blocks no later request can hit (a partial last block) to
        its front, reused first, as vLLM's ``BlockPool.free_blocks`` does."""
        unkeyed: list[int] = []
        for block in reversed(blocks):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free[block] = None
                if self._hash_of[block] is None:
                    unkeyed.append(block)
        for block in reversed(unkeyed):
            self._free.move_to_end(block, last=False)

    def reset_cache(self) -> None:
        """Forget every cached prefix (blocks in use keep their data)."""
        self._index.clear()
        self._hash_of = [None] * self.num_blocks
