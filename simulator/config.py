"""The simulator's configuration: engine arguments, faults, and the server's face.

Every field can come from a YAML file (``servemon sim --config sim.yaml``) and from a
flag; flags win. :class:`Faults` can also be changed while the simulator runs
(``PUT /sim/config``). Both are laid over a config by :func:`merge`, the one
function every servemon config uses (:func:`servemon.fields.merge`, exported here
for the server).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from annotated_types import Ge, Gt, Le

from servemon.fields import FORBID_EXTRA, merge

__all__ = ["DIALECTS", "WIRE_DIALECTS", "Faults", "SimConfig", "merge"]

Fraction = Annotated[float, Ge(0), Le(1)]
Seconds = Annotated[float, Ge(0)]

Dialect = Literal["vllm", "vllm-0.10", "vllm-0.8", "vllm-v0", "sglang", "llamacpp"]
DIALECTS: tuple[str, ...] = (
    "vllm",
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
    served_model_name: str | None = None
    max_num_seqs: Annotated[int, Ge(1)] = 256
    max_num_batched_tokens: Annotated[int, Ge(1)] = 2048
    num_gpu_blocks: Annotated[int, Ge(1)] | None = None
    block_size: Annotated[int, Ge(1)] | None = None
    max_model_len: Annotated[int, Ge(2)] | None = None
    enable_prefix_caching: bool = True
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
    seed: int = 0
    trace: str | None = None
    faults: Faults = field(default_factory=Faults)
