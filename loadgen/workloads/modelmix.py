"""``--model a=0.7,b=0.3``: the models (or LoRA adapters) a run's requests ask for.

A plain name (``--model qwen``) is one model, as always. A mix names each model with
a weight; weights are relative (they need not add up to 1). Request ``i`` asks for
the model drawn for ``i`` from the run's seed, so a rerun with the same seed sends
the same model to the same request, and shards of one schedule agree. A
conversation (a sessions workload) keeps one model for all its turns: the draw is
the session's. Every request of a mix carries its model in ``requests.jsonl``
(``model``), in the live client series (the ``model`` label) and in the summary's
``by_model``.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from dataclasses import dataclass, field

from servemon.core.errors import ConfigError

__all__ = ["ModelMix", "parse_model"]


@dataclass(frozen=True, slots=True)
class ModelMix:
    """Models with weights (see the module docstring)."""

    names: tuple[str, ...]
    weights: tuple[float, ...]
    cumulative: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "cumulative", tuple(itertools.accumulate(self.weights))
        )

    def draw(self, seed: int, index: int) -> str:
        """The model of request (or session) ``index``."""
        if len(self.names) == 1:
            return self.names[0]
        cumulative = self.cumulative
        at = random.Random(f"{seed}:model:{index}").random() * cumulative[-1]
        return self.names[min(bisect.bisect_right(cumulative, at), len(self.names) - 1)]

    def __str__(self) -> str:
        return ",".join(
            f"{n}={w:g}" for n, w in zip(self.names, self.weights, strict=True)
        )


def parse_model(text: str) -> ModelMix | None:
    """A ``--model`` value as a mix; None for one plain model name (a name may hold
    ``=`` only in a mix, where the weight follows the last one)."""
    if "=" not in text:
        return None
    names: list[str] = []
    weights: list[float] = []
    for item in text.split(","):
        name, sep, weight_text = item.strip().rpartition("=")
        name = name.strip()
        if not sep or not name:
            raise ConfigError(
                f"--model: expected NAME=WEIGHT in a mix, got {item.strip()!r} "
                "(e.g. --model base=0.7,lora-a=0.3)"
            )
        try:
            weight = float(weight_text)
        except ValueError:
            weight = math.nan
        if not (weight > 0 and math.isfinite(weight)):
            raise ConfigError(
                f"--model: {name}: the weight must be a number > 0, "
                f"got {weight_text.strip()!r}"
            )
        if name in names:
            raise ConfigError(f"--model: {name!r} given twice")
        names.append(name)
        weights.append(weight)
    return ModelMix(tuple(names), tuple(weights))
