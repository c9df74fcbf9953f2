"""The engine model: continuous batching over a paged KV cache, stepped in real time.

One step, as vLLM's V1 scheduler does it:

1. Running requests first, oldest first: each gets the tokens it still needs (the
   rest of its prefill, chunked to the step's token budget, or one decode token). If
   the KV pool cannot hold them, the newest running request is preempted back to the
   front of the queue (its blocks freed; it will recompute), until it fits.
2. If nothing was preempted, waiting requests are admitted while there is budget and
   a free sequence slot: prefix-cache hits are looked up, the rest is prefilled (the
   first chunk now; but, as vLLM's ``scheduler_reserve_full_isl``, only once blocks
   for the whole sequence so far are free). With
   LoRA, a request whose adapter would make the batch hold more than ``max_loras``
   distinct adapters is skipped (it stays waiting, in its place) and the next one is
   tried, as vLLM's V1 scheduler does; adapters the batch uses that are not loaded
   are loaded first (:mod:`servemon.simulator.lora`), at ``lora_load_s`` each.
3. The step lasts as long as the profile's cost model says; then every request that
   has caught up with its tokens samples one output token.

The engine never touches the network: the HTTP layer adds requests, reads the pieces
they produce (:attr:`Request.pieces`, woken by :attr:`Request.wakeup`), and aborts
them when a client goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import random
import time
from collections import deque
from collections.abc import Sequence

from servemon.simulator.kvcache import BlockPool, prompt_block_hashes
from servemon.simulator.lora import AdapterCache
from servemon.simulator.profiles import Profile
from servemon.simulator.request import EngineArgs, Request
from servemon.simulator.stats import EngineStats
from servemon.simulator.tokenizer import WordTokenizer

__all__ = ["Engine", "EngineArgs", "Request"]

#: The latest a step may start, as a share of it, and still be timed from when
#: the last one was due to end: the engine's clock runs on through wake-ups late
#: by that much, and starts again from the wake-up past it.
MAX_CATCH_UP = 0.5


class Engine:
    """Schedules requests step by step; :meth:`run` drives it on the event loop."""

    def __init__(self, profile: Profile, args: EngineArgs) -> None:
        self.profile = profile
        self.args = args
        self.pool = BlockPool(args.num_gpu_blocks, args.block_size)
        self.stats = EngineStats(max_model_len=args.max_model_len)
        self.tokenizer = WordTokenizer()
        self.speed = 1.0
        self.eos_probability = args.eos_probability
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._work = asyncio.Event()
        self._ids = itertools.count()
        self.adapters = AdapterCache(args.max_cpu_loras, args.lora_modules)
        #: Seconds the step just scheduled spends loading adapters.
        self.step_load_s = 0.0
        #: Adapters in the order first asked for (how vLLM lists them).
        self._adapter_order: dict[str, None] = {}
        #: Prompt tokens of the requests not past their prefill (no first token
        #: yet, not finished): what ``max_num_queued_tokens`` limits.
        self.prefill_tokens = 0

    @property
    def lora_enabled(self) -> bool:
        """Whether the engine serves LoRA adapters."""
        return bool(self.args.lora_modules)

    # -- what the HTTP layer calls --------------------------------------------

    def capacity_error(self, prompt_tokens: int, max_tokens: int) -> str | None:
        """Why a request of this size can never run here, or ``None``."""
        total = prompt_tokens + max_tokens
        if total > self.args.max_model_len:
            return (
                f"This model's maximum context length is {self.args.max_model_len} "
                f"tokens. However, you requested {total} tokens ({prompt_tokens} in "
                f"the messages, {max_tokens} in the completion)."
            )
        if self.pool.blocks_for(total) > self.pool.num_blocks:
            return (
                f"The request needs {self.pool.blocks_for(total)} KV cache blocks but "
                f"the cache holds only {self.pool.num_blocks}."
            )
        return None

    def admission_rejection(self, prompt_tokens: int) -> str | None:
        """The queue limit that refuses a new request now (and counts it), or
        ``None``. As vLLM's front end: the requests in flight, waiting or running,
        against ``max_num_queued_reqs``; the prompt tokens still to prefill,
        against ``max_num_queued_tokens`` (refused once reached, whatever the new
        request's own length)."""
        args = self.args
        reason = None
        in_flight = len(self.waiting) + len(self.running)
        if (
            args.max_num_queued_reqs is not None
            and in_flight >= args.max_num_queued_reqs
        ):
            reason = "max_num_queued_reqs"
        elif (
            args.max_num_queued_tokens is not None
            and self.prefill_tokens >= args.max_num_queued_tokens
        ):
            reason = "max_num_queued_tokens"
        if reason is not None:
            self.stats.admission_rejections[reason] += 1
        return reason

    def waiting_by_reason(self) -> dict[str, int]:
        """The waiting requests split by why they wait: ``deferred`` (skipped for
        the LoRA budget) and ``capacity`` (the rest: no room yet)."""
        deferred = sum(1 for req in self.waiting if req.deferred)
        return {"capacity": len(self.waiting) - deferred, "deferred": deferred}

    def add_request(
        self,
        request_id: str,
        prompt: list[int],
        *,
        max_tokens: int,
        min_tokens: int = 0,
        ignore_eos: bool = False,
        arrival_s: float | None = None,
        lora: str | None = None,
    ) -> Request:
        """Queue a request; its output length (and reasoning length) is drawn now
        from the seeded stream."""
        n = next(self._ids)
        rng = random.Random(f"{self.args.seed}:{n}")
        low, high = self.args.reasoning_tokens
        reasoning = (
            random.Random(f"{self.args.seed}:{n}:reasoning").randint(low, high)
            if high
            else 0
        )
        target = self._draw_length(rng, max_tokens, min_tokens, ignore_eos, reasoning)
        now = time.monotonic()
        req = Request(
            request_id=request_id,
            prompt=prompt,
            max_tokens=max_tokens,
            target_tokens=target,
            arrival_s=now if arrival_s is None else arrival_s,
            queued_s=now,
            rng=rng,
            block_keys=prompt_block_hashes(prompt, self.args.block_size)
            if self.args.enable_prefix_caching
            else [],
            lora=lora,
            reasoning_tokens=min(reasoning, max_tokens),
        )
        if lora is not None:
            self._adapter_order.setdefault(lora, None)
        self.stats.requests_received += 1
        self.stats.params_max_tokens.observe(max_tokens)
        self.stats.params_n.observe(1)
        self.prefill_tokens += len(prompt)
        self.waiting.append(req)
        self._work.set()
        return req

    def abort(self, req: Request) -> None:
        """Drop a request whose client went away; its blocks are freed at once."""
        if req.finished:
            return
        if req in self.running:
            self.running.remove(req)
        else:
            with contextlib.suppress(ValueError):
                self.waiting.remove(req)
        self._finish(req, "abort", time.monotonic())

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix."""
        self.pool.reset_cache()

    # -- the step loop ----------------------------------------------------------

    async def run(self) -> None:
        """Step forever; idle without work. Cancel to stop."""
        loop = asyncio.get_running_loop()
        due: float | None = None  # when the last step ended on the engine's clock
        while True:
            if not self.running and not self.waiting:
                due = None
                self._work.clear()
                await self._work.wait()
                continue
            now = loop.time()
            plan = self.schedule()
            if not plan:
                # Nothing fits right now (should not happen: requests that can never
                # fit are refused at the door). Wait for an abort or a new request.
                due = None
                self._work.clear()
                await self._work.wait()
                continue
            duration = self.step_seconds(plan)
            # Back to back, a step starts when the last one was due to end, not
            # when the loop woke to end it: a wake-up late by up to half a step
            # (a loaded machine) is taken from this step, so that the engine
            # keeps its profile's pace. Later than that the machine held the
            # process, and the step starts now: an engine that caught up then
            # would ask the starved process for more steps a second than it has.
            if due is None or now - due > duration * MAX_CATCH_UP:
                due = now
            due += duration
            await asyncio.sleep(max(0.0, due - loop.time()))
            self.apply(plan, time.monotonic())

    def step_seconds(self, plan: Sequence[tuple[Request, int]]) -> float:
        """How long the step in ``plan`` takes under the profile and speed."""
        tokens = sum(n for _, n in plan)
        kv_read = sum(req.num_computed for req, _ in plan)
        cost = self.profile.step_seconds(tokens, kv_read, len(plan))
        return (cost + self.step_load_s) / self.speed

    def schedule(self) -> list[tuple[Request, int]]:
        """Choose this step's requests and how many tokens each computes; load the
        adapters they use (:attr:`step_load_s`)."""
        plan = self._schedule()
        if self.lora_enabled:
            used = dict.fromkeys(req.lora for req, _ in plan if req.lora is not None)
            self.step_load_s = self.adapters.activate(used) * self.args.lora_load_s
        return plan

    def lora_state(self) -> tuple[list[str], list[str]]:
        """The adapters with running requests and those with waiting requests, in
        the order they were first asked for (vLLM's ``lora_requests_info``)."""
        running = {req.lora for req in self.running}
        waiting = {req.lora for req in self.waiting}
        order = self._adapter_order
        return (
            [name for name in order if name in running],
            [name for name in order if name in waiting],
        )

    def _schedule(self) -> list[tuple[Request, int]]:
        budget = self.args.max_num_batched_tokens
        plan: list[tuple[Request, int]] = []
        preempted = False
        index = 0
        while index < len(self.running) and budget > 0:
            req = self.running[index]
            new = min(req.num_tokens - req.num_computed, budget)
            fits = True
            while not self._grow(req, new):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    fits = False
                    break
            if not fits:
                break
            plan.append((req, new))
            budget -= new
            index += 1
        if preempted:
            return plan
        now = time.monotonic()
        # The adapters of the batch so far: a waiting request whose adapter would
        # make them more than max_loras is skipped and stays waiting, in its place.
        loras = {req.lora for req, _ in plan if req.lora is not None}
        skipped: list[Request] = []
        while (
            self.waiting and budget > 0 and len(self.running) < self.args.max_num_seqs
        ):
            req = self.waiting[0]
            if (
                req.lora is not None
                and req.lora not in loras
                and len(loras) >= self.args.max_loras
            ):
                req.deferred = True
                skipped.append(self.waiting.popleft())
                continue
            if not self._admit(req, budget):
                break
            self.waiting.popleft()
            req.deferred = False
            self.running.append(req)
            if req.lora is not None:
                loras.add(req.lora)
            if req.scheduled_s is None:
                req.scheduled_s = now
                self.stats.queue.observe(now - req.queued_s)
            new = min(req.num_tokens - req.num_computed, budget)
            plan.append((req, new))
            budget -= new
        self.waiting.extendleft(reversed(skipped))
        return plan

    def apply(self, plan: Sequence[tuple[Request, int]], now: float) -> None:
        """Finish a step at ``now``: advance prefill, sample tokens, retire requests."""
        tokens = sum(n for _, n in plan)
        self.stats.iteration_tokens.observe(tokens)
        if self.args.enable_mfu_metrics:
            # The step as step_seconds priced it: KV read before this step's tokens.
            work = self.profile.step_work(tokens, sum(r.num_computed for r, _ in plan))
            self.stats.estimated_flops += work.flops
            self.stats.estimated_read_bytes += work.read_bytes
            self.stats.estimated_write_bytes += work.write_bytes
        for req, new in plan:
            if req.finished:
                continue  # aborted during the step
            req.num_computed += new
            self._key_full_blocks(req)
            if req.num_computed >= req.num_tokens:
                self._sample(req, now)
        if self.lora_enabled:
            running, waiting = self.lora_state()
            self.stats.record_lora(running, waiting)

    # -- internals --------------------------------------------------------------

    def _draw_length(
        self,
        rng: random.Random,
        max_tokens: int,
        min_tokens: int,
        ignore_eos: bool,
        reasoning: int = 0,
    ) -> int:
        """The output length: ``max_tokens``, or earlier by the seeded
        end-of-sequence draw, which starts after the reasoning (a model does not
        stop while it thinks); max_tokens counts reasoning and answer, as vLLM's."""
        p = self.eos_probability
        if ignore_eos or p <= 0.0:
            return max_tokens
        if p >= 1.0:
            return max(1, min(max(min_tokens, reasoning + 1), max_tokens))
        draw = math.ceil(math.log1p(-rng.random()) / math.log1p(-p))
        return max(1, min(max_tokens, max(min_tokens, 0) + reasoning + draw))

    def _grow(self, req: Request, new: int) -> bool:
        """Give a running request the blocks for ``new`` more tokens, if free."""
        need = self.pool.blocks_for(req.num_computed + new) - len(req.blocks)
        if need <= 0:
            return True
        if need > self.pool.num_free:
            return False
        req.blocks.extend(self.pool.allocate(need))
        return True

    def _admit(self, req: Request, budget: int) -> bool:
        """Take prefix hits and blocks for a waiting request's first chunk."""
        max_hit_blocks = (req.num_tokens - 1) // self.args.block_size
        hits = self.pool.lookup(req.block_keys[:max_hit_blocks])
        cached = len(hits) * self.args.block_size
        new = min(req.num_tokens - cached, budget)
        need = self.pool.blocks_for(cached + new) - len(hits)
        # vLLM admits a waiting request only if its whole sequence so far fits
        # (``scheduler_reserve_full_isl``, on by default): a long prompt is not let
        # in for its first chunk alone, though only that chunk's blocks are taken.
        whole = self.pool.blocks_for(req.num_tokens) - len(hits)
        if not self.pool.can_take(hits, whole):
            return False
        self.pool.take(hits)
        req.blocks = [*hits, *self.pool.allocate(need)]
        req.num_keyed_blocks = len(hits)
        req.num_computed = cached
        if not req.num_preemptions:
            # What the answer reports: the first admission's hits, as vLLM does.
            req.cached_tokens = cached
        if not self.args.enable_prefix_caching or req.num_preemptions:
            # vLLM keeps a preempted request's second lookup out of its prefix
            # cache counters (``PrefixCacheStats.preempted_*``).
            return True
        stats = self.stats
        stats.prefix_queries += req.num_tokens
        stats.prefix_hits += cached
        stats.prefix_query_blocks += req.num_tokens // self.args.block_size
        stats.prefix_hit_blocks += len(hits)
        return True

    def _preempt(self, req: Request) -> None:
        self.pool.free(req.blocks)
        req.blocks = []
        req.num_computed = 0
        req.num_keyed_blocks = 0
        req.num_preemptions += 1
        self.waiting.appendleft(req)
        self.stats.preemptions += 1

    def _key_full_blocks(self, req: Request) -> None:
        full = min(req.num_computed, len(req.prompt)) // self.args.block_size
        for i in range(req.num_keyed_blocks, min(full, len(req.block_keys))):
            self.pool.cache(req.blocks[i], req.block_keys[i])
        req.num_keyed_blocks = max(req.num_keyed_blocks, full)

    def _sample(self, req: Request, now: float) -> None:
        stats = self.stats
        req.num_output += 1
        req.pieces.append(self.tokenizer.output_piece(req.rng))
        req.token_s.append(now)
        stats.generation_tokens += 1
        if req.first_token_s is None:
            req.first_token_s = now
            stats.prompt_tokens += len(req.prompt)
            stats.prompt_tokens_cached += req.cached_tokens
            self.prefill_tokens -= len(req.prompt)
            stats.ttft.observe(now - req.arrival_s)
        elif req.last_token_s is not None:
            stats.itl.observe(now - req.last_token_s)
        req.last_token_s = now
        if req.num_output >= req.target_tokens:
            self.running.remove(req)
            reason = "length" if req.target_tokens >= req.max_tokens else "stop"
            self._finish(req, reason, now)
        req.wakeup.set()

    def _finish(self, req: Request, reason: str, now: float) -> None:
        self.pool.free(req.blocks)
        req.blocks = []
        req.finish_reason = reason
        req.finished_s = now
        stats = self.stats
        if req.first_token_s is None:
            self.prefill_tokens -= len(req.prompt)
        stats.finished[reason] += 1
        stats.e2e.observe(now - req.arrival_s)
        stats.request_prompt_tokens.observe(len(req.prompt))
        stats.request_preemptions.observe(req.num_preemptions)
        stats.prefill_kv_computed.observe(len(req.prompt) - req.cached_tokens)
        stats.request_generation_tokens.observe(req.num_output)
        if req.scheduled_s is not None:
            stats.inference.observe(now - req.scheduled_s)
            if req.first_token_s is not None:
                stats.prefill.observe(req.first_token_s - req.scheduled_s)
                stats.decode.observe(now - req.first_token_s)
        if req.first_token_s is not None and req.num_output > 1:
            stats.tpot.observe((now - req.first_token_s) / (req.num_output - 1))
        req.wakeup.set()
        self._work.set()
