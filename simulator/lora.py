"""LoRA adapters in the engine: which are loaded, and what loading one costs.

As vLLM's worker keeps them (``LRUCacheWorkerLoRAManager``): up to
``--max-cpu-loras`` adapters stay loaded, least recently used first out. The
adapters named at startup (``--lora-modules``) are loaded then, in order, so with
more of them than the cache holds the first ones are already evicted. A step whose
batch uses an adapter that is not loaded loads it first, evicting the least recently
used one when the cache is full; the engine charges ``lora_load_s`` per load to that
step. How many distinct adapters a batch may hold (``--max-loras``) is the
scheduler's rule (:meth:`servemon.simulator.engine.Engine.schedule`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

__all__ = ["AdapterCache"]


class AdapterCache:
    """The loaded adapters, least recently used first."""

    def __init__(self, capacity: int, preload: Iterable[str] = ()) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._loaded: OrderedDict[str, None] = OrderedDict()
        #: Adapters loaded since startup (the preloaded ones not counted).
        self.loads = 0
        for name in preload:
            self._load(name)
        self.loads = 0

    @property
    def loaded(self) -> tuple[str, ...]:
        """The loaded adapters, least recently used first."""
        return tuple(self._loaded)

    def activate(self, names: Iterable[str]) -> int:
        """Use ``names`` in one step: load those not loaded (evicting the least
        recently used), mark all as just used; how many had to be loaded."""
        loaded = 0
        for name in names:
            if name in self._loaded:
                self._loaded.move_to_end(name)
            else:
                self._load(name)
                loaded += 1
        return loaded

    def _load(self, name: str) -> None:
        if name in self._loaded:
            self._loaded.move_to_end(name)
            return
        while len(self._loaded) >= self.capacity:
            self._loaded.popitem(last=False)
        self._loaded[name] = None
        self.loads += 1
