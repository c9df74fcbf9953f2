"""The pieces of the ``--workload`` spec language every kind shares: ``key=value``
options, integers and ``N``/``A:B`` ranges, each wrong one a one-line error naming
the kind and the key."""

from __future__ import annotations

from collections.abc import Sequence

from servemon.core.errors import ConfigError
from servemon.loadgen.workloads.prompts import OutputBudget

__all__ = ["spec_fraction", "spec_int", "spec_options", "spec_range"]


def spec_options(kind: str, text: str, known: Sequence[str]) -> dict[str, str]:
    """``a=1,b=2`` as a dict; an unknown key, a repeated one or an item without
    ``=`` is an error."""
    options: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep:
            raise ConfigError(f"--workload: {kind}: expected key=value, got {item!r}")
        if key not in known:
            raise ConfigError(
                f"--workload: {kind}: unknown key {key!r} (known: {', '.join(known)})"
            )
        if key in options:
            raise ConfigError(f"--workload: {kind}: {key!r} given twice")
        options[key] = value.strip()
    return options


def spec_int(kind: str, key: str, value: str, *, minimum: int = 1) -> int:
    """An integer of at least ``minimum``."""
    try:
        number = int(value)
    except ValueError:
        number = minimum - 1
    if number < minimum:
        raise ConfigError(
            f"--workload: {kind}: {key} must be an integer >= {minimum}, got {value!r}"
        )
    return number


def spec_fraction(kind: str, key: str, value: str) -> float:
    """A number in ``[0, 1)``."""
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not 0.0 <= number < 1.0:  # NaN fails too
        raise ConfigError(
            f"--workload: {kind}: {key} must be a number with 0 <= {key} < 1, "
            f"got {value!r}"
        )
    return number


def spec_range(kind: str, key: str, value: str) -> OutputBudget:
    """``N`` or ``A:B`` with ``1 <= A <= B``."""
    low_text, sep, high_text = value.partition(":")
    try:
        low = int(low_text)
        high = int(high_text) if sep else low
    except ValueError:
        low = high = 0
    if low < 1 or high < low:
        raise ConfigError(
            f"--workload: {kind}: {key} must be N or A:B with 1 <= A <= B, "
            f"got {value!r}"
        )
    return OutputBudget(low, high)
