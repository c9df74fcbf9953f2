"""Engine profiles: the cost model that sets how long one engine step takes.

A step costs a fixed overhead (kernel launches, scheduling, sampling: dominant for a
small model run eagerly), a per-sequence overhead, and the larger of two bounds::

    memory  = (weights + KV read by the step) / memory bandwidth
    compute = 2 * params * tokens in the step / compute throughput

The same figures (FLOPs, bytes read, bytes written) are what the simulator publishes
as vLLM's MFU estimates (``--enable-mfu-metrics``).

Profiles are YAML files; the built-in ones ship in ``simulator/profiles/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated

from annotated_types import Ge, Gt, Le

from servemon.core.errors import ConfigError
from servemon.core.fields import FORBID_EXTRA, load, read_yaml

__all__ = ["BUILTIN_PROFILES", "Profile", "StepWork", "load_profile"]

BUILTIN_PROFILES = ("tiny", "qwen3-0.6b-eager", "vllm-cpu-tiny")

Positive = Annotated[float, Gt(0)]
NonNegative = Annotated[float, Ge(0)]


@dataclass(frozen=True, slots=True)
class StepWork:
    """One step's floating-point operations and bytes read and written."""

    flops: float
    read_bytes: float
    write_bytes: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """What the simulated model and GPU cost; see ``docs/simulator.md``."""

    __pydantic_config__ = FORBID_EXTRA

    name: str
    description: str = ""
    model: str = "sim-model"
    params: Positive
    bytes_per_param: Positive = 2.0
    kv_bytes_per_token: Positive
    memory_bandwidth: Positive
    compute_flops: Positive
    step_overhead_s: NonNegative
    per_seq_overhead_s: NonNegative = 0.0
    frontend_latency_s: NonNegative = 0.0
    num_gpu_blocks: Annotated[int, Ge(1)]
    block_size: Annotated[int, Ge(1)] = 16
    max_model_len: Annotated[int, Ge(2)] = 4096
    eos_probability: Annotated[float, Ge(0), Le(1)] = 0.0

    def step_seconds(self, tokens: int, kv_tokens_read: int, seqs: int) -> float:
        """Duration of one engine step that computes ``tokens`` new tokens for
        ``seqs`` sequences, reading ``kv_tokens_read`` cached tokens of KV."""
        work = self.step_work(tokens, kv_tokens_read)
        memory = work.read_bytes / self.memory_bandwidth
        compute = work.flops / self.compute_flops
        return (
            self.step_overhead_s + self.per_seq_overhead_s * seqs + max(memory, compute)
        )

    def step_work(self, tokens: int, kv_tokens_read: int) -> StepWork:
        """What one step computes and moves, as the cost model prices it: the
        weights' matrix products for ``tokens`` tokens, the weights and
        ``kv_tokens_read`` tokens of KV read, the new tokens' KV written."""
        return StepWork(
            flops=2.0 * self.params * tokens,
            read_bytes=self.params * self.bytes_per_param
            + kv_tokens_read * self.kv_bytes_per_token,
            write_bytes=tokens * self.kv_bytes_per_token,
        )


def load_profile(name_or_path: str) -> Profile:
    """A built-in profile by name, or a profile YAML file by path."""
    if name_or_path in BUILTIN_PROFILES:
        package = resources.files("servemon.simulator")
        ref = package / "profiles" / f"{name_or_path}.yaml"
        with resources.as_file(ref) as path:
            return _from_file(path)
    path = Path(name_or_path)
    if not path.exists():
        known = ", ".join(BUILTIN_PROFILES)
        raise ConfigError(
            f"profile: {name_or_path!r} is neither a built-in profile ({known}) "
            "nor a file"
        )
    return _from_file(path)


def _from_file(path: Path) -> Profile:
    data = read_yaml(path)
    data.setdefault("name", path.stem)
    return load(Profile, data, str(path))
