"""What the simulated engine is started with (:class:`EngineArgs`, vLLM's flags of
the same names) and what it holds of each request (:class:`Request`)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

__all__ = ["EngineArgs", "Request"]


@dataclass(frozen=True, slots=True)
class EngineArgs:
    """The scheduler's and cache's limits (vLLM's flags of the same names)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    num_gpu_blocks: int
    block_size: int
    max_model_len: int
    enable_prefix_caching: bool
    eos_probability: float
    seed: int
    #: The LoRA adapters served (none: LoRA off) and vLLM's limits on them.
    lora_modules: tuple[str, ...] = ()
    max_loras: int = 1
    max_cpu_loras: int = 1
    lora_load_s: float = 0.0
    #: Reasoning tokens per answer, drawn uniformly from ``low..high``.
    reasoning_tokens: tuple[int, int] = (0, 0)
    #: vLLM's admission limits (``None``: none): requests in flight (waiting or
    #: running), and prompt tokens of requests not past their prefill.
    max_num_queued_reqs: int | None = None
    max_num_queued_tokens: int | None = None
    #: vLLM's ``--enable-mfu-metrics``: count each step's FLOPs and bytes.
    enable_mfu_metrics: bool = False


@dataclass(eq=False, slots=True)
class Request:
    """One request inside the engine, with its server-side timeline."""

    request_id: str
    prompt: list[int]
    max_tokens: int
    target_tokens: int
    arrival_s: float
    rng: random.Random
    block_keys: list[int]
    #: The LoRA adapter asked for, or ``None`` for the base model.
    lora: str | None = None
    #: How many of the first output tokens are reasoning.
    reasoning_tokens: int = 0
    queued_s: float = 0.0
    scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    finished_s: float | None = None
    finish_reason: str | None = None
    num_computed: int = 0
    num_output: int = 0
    cached_tokens: int = 0
    num_preemptions: int = 0
    #: Skipped by the last schedule that reached it for a reason other than room
    #: (the LoRA budget): vLLM's ``waiting_by_reason`` "deferred".
    deferred: bool = False
    blocks: list[int] = field(default_factory=list)
    num_keyed_blocks: int = 0
    pieces: list[str] = field(default_factory=list)
    token_s: list[float] = field(default_factory=list)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens: what the KV cache must hold after the step."""
        return len(self.prompt) + self.num_output

    @property
    def finished(self) -> bool:
        """Whether the request has left the engine."""
        return self.finish_reason is not None
