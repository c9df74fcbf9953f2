"""The simulator's configuration: engine arguments, faults, and the server's face.

Every field can come from a YAML file (``servemon sim --config sim.yaml``) and from a
flag; flags win. :class:`Faults` can also be changed while the simulator runs
(``PUT /sim/config``). Both are laid over a config by :func:`merge`, the one
function every servemon config uses (:func:`servemon.core.fields.merge`, exported here
for the server).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Literal

from annotated_types import Ge, Gt, Le, Len
from pydantic import BeforeValidator

from servemon.core.fields import FORBID_EXTRA, merge

__all__ = [
    "DIALECTS",
    "REASONING_FIELDS",
    "WIRE_DIALECTS",
    "Faults",
    "SimConfig",
    "merge",
    "parse_reasoning_tokens",
]

Fraction = Annotated[float, Ge(0), Le(1)]
Seconds = Annotated[float, Ge(0)]

Dialect = Literal[
    "vllm",
    "vllm-0.25",
    "vllm-0.34",
    "vllm-0.10",
    "vllm-0.8",
    "vllm-v0",
    "sglang",
    "llamacpp",
]
DIALECTS: tuple[str, ...] = (
    "vllm",
    "vllm-0.25",
    "vllm-0.34",
    "vllm-0.10",
    "vllm-0.8",
    "vllm-v0",
    "sglang",
    "llamacpp",
)
#: The servers whose wire format (stream grammar, errors, endpoints) it can speak.
WireDialect = Literal["vllm", "transformers", "llamacpp"]
WIRE_DIALECTS: tuple[str, ...] = ("vllm", "transformers", "llamacpp")
MetricsFault = Literal["ok", "garbage", "hang", "503"]
#: Where a chat answer's reasoning goes: vLLM <= 0.11.0 and llama.cpp
#: ``reasoning_content``; vLLM 0.11.1-0.15 both (``reasoning`` and the deprecated
#: copy); vLLM >= 0.16 ``reasoning`` only.
ReasoningField = Literal["reasoning_content", "reasoning", "both"]
REASONING_FIELDS: tuple[str, ...] = ("reasoning_content", "reasoning", "both")

_NAME = re.compile(r"[^\s,=]+")


def _names(value: object) -> object:
    """One name or several (a YAML list, a repeated flag) as a tuple of names."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(value) if isinstance(value, list | tuple) else value


def _adapter_name(value: object) -> object:
    """A LoRA module as vLLM's ``--lora-modules`` takes it, ``name=path`` (the path
    is ignored here), or a bare name."""
    if isinstance(value, str):
        name = value.split("=", 1)[0].strip()
        if not _NAME.fullmatch(name):
            raise ValueError(f"expected name or name=path, got {value!r}")
        return name
    return value


def parse_reasoning_tokens(text: str | int) -> tuple[int, int]:
    """``"0"`` (off), ``"N"`` or ``"A:B"`` (uniform from A to B, both included) as
    ``(low, high)``."""
    if isinstance(text, int) and not isinstance(text, bool):
        low = high = text
    elif isinstance(text, str):
        parts = text.split(":")
        try:
            if len(parts) == 1:
                low = high = int(parts[0])
            elif len(parts) == 2:
                low, high = int(parts[0]), int(parts[1])
            else:
                raise ValueError(text)
        except ValueError:
            raise ValueError(f"expected N or A:B, got {text!r}") from None
    else:
        raise ValueError(f"expected N or A:B, got {text!r}")
    if low < 0 or high < low:
        raise ValueError(f"expected 0 <= A <= B, got {text!r}")
    return low, high


ModelNames = Annotated[
    tuple[Annotated[str, Len(min_length=1)], ...], BeforeValidator(_names)
]
AdapterName = Annotated[str, BeforeValidator(_adapter_name)]
ReasoningTokens = Annotated[
    tuple[int, int],
    BeforeValidator(
        lambda v: parse_reasoning_tokens(v) if isinstance(v, str | int) else v
    ),
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Faults:
    """Misbehaviour to inject; everything is off by default."""

    __pydantic_config__ = FORBID_EXTRA

    http_500_fraction: Fraction = 0.0
    http_503_fraction: Fraction = 0.0
    cut_stream_fraction: Fraction = 0.0
    malformed_sse_fraction: Fraction = 0.0
    first_token_stall_s: Seconds = 0.0
    slow_headers_s: Seconds = 0.0
    metrics: MetricsFault = "ok"
    role_chunk: bool = True
    #: None: with the first token, as vLLM sends it; a number: that long after the
    #: response headers (0 = at once, as some servers do).
    role_chunk_delay_s: Seconds | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    """Everything ``servemon sim`` takes."""

    __pydantic_config__ = FORBID_EXTRA

    host: str = "127.0.0.1"
    port: Annotated[int, Ge(0), Le(65535)] = 8000
    profile: str = "qwen3-0.6b-eager"
    #: The names the model answers to, all aliases of one model (vLLM's
    #: ``--served-model-name NAME [NAME ...]``); the first names it in responses
    #: and metrics. Empty: the profile's model.
    served_model_name: ModelNames = ()
    #: LoRA adapters served on top of the model (vLLM's ``--lora-modules
    #: name=path``; the path is ignored). Any adapter turns LoRA on.
    lora_modules: tuple[AdapterName, ...] = ()
    #: Most distinct adapters in one batch (vLLM's ``--max-loras``, default 1).
    max_loras: Annotated[int, Ge(1)] = 1
    #: Adapters kept loaded (vLLM's ``--max-cpu-loras``; default ``max_loras``).
    max_cpu_loras: Annotated[int, Ge(1)] | None = None
    #: Seconds a step takes longer for each adapter it must load first.
    lora_load_s: Seconds = 0.02
    max_num_seqs: Annotated[int, Ge(1)] = 256
    max_num_batched_tokens: Annotated[int, Ge(1)] = 2048
    num_gpu_blocks: Annotated[int, Ge(1)] | None = None
    block_size: Annotated[int, Ge(1)] | None = None
    max_model_len: Annotated[int, Ge(2)] | None = None
    enable_prefix_caching: bool = True
    #: vLLM's admission limits (none by default): a request that finds this many
    #: in flight (waiting or running), or this many prompt tokens still to
    #: prefill, is refused with a 503 and counted as an admission rejection.
    max_num_queued_reqs: Annotated[int, Ge(1)] | None = None
    max_num_queued_tokens: Annotated[int, Ge(1)] | None = None
    #: vLLM's --enable-mfu-metrics: count each step's FLOPs and bytes as the
    #: profile's cost model prices them (the families are listed either way).
    enable_mfu_metrics: bool = False
    eos_probability: Fraction | None = None
    speed: Annotated[float, Gt(0)] = 1.0
    metrics_dialect: Dialect = "vllm"
    #: Whose wire format: stream grammar, error bodies and endpoints (see
    #: docs/simulator.md). ``llamacpp`` implies the ``llamacpp`` metric names.
    dialect: WireDialect = "vllm"
    #: vLLM's --enable-prompt-tokens-details: usage.prompt_tokens_details.
    enable_prompt_tokens_details: bool = False
    #: vLLM's --enable-per-request-metrics: a ``metrics`` object per answer.
    enable_per_request_metrics: bool = False
    #: Reasoning tokens at the start of each answer: ``0`` (none), ``N``, or
    #: ``A:B`` (drawn per request from the seed, uniform from A to B).
    reasoning_tokens: ReasoningTokens = (0, 0)
    #: The chat delta/message field reasoning goes in (see :data:`ReasoningField`).
    reasoning_field: ReasoningField = "reasoning_content"
    #: ``usage.completion_tokens_details.reasoning_tokens``: vLLM (through 0.25 at
    #: least) does not report it; OpenAI does. Off by default, as vLLM.
    reasoning_usage: bool = False
    seed: int = 0
    trace: str | None = None
    faults: Faults = field(default_factory=Faults)

    def __post_init__(self) -> None:
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras "
                f"({self.max_loras})"
            )
        names = set(self.served_model_name)
        clash = next((a for a in self.lora_modules if a in names), None)
        if clash is not None:
            raise ValueError(f"lora_modules: {clash!r} is also a served model name")
