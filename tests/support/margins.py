"""Timing bounds and their margins on record (docs/testing.md, "Timing bounds and
their margins").

A test that holds a timing or a share to a bound asserts it through the ``margin``
fixture (tests/conftest.py), which also writes the figure and its bound into the
test's JUnit XML (``SERVEMON_JUNIT_DIR``; a property named ``margin:NAME``)::

    margin("dispatch lag p90 s", lag["p90"], below=0.05)
    margin("within", held, low=0.6)
    margin("gap s", gap, low=0.3, causal=True)  # only a broken behaviour crosses it

``low``/``high`` are inclusive (``>=``, ``<=``), ``above``/``below`` strict; one of
each side at most. ``causal`` marks a bound that no timing can cross unless the
behaviour is broken (a server timer that starts after the client's ``sent``): its
margin is not judged.

``scripts/margins JUNIT_DIR...`` (one folder or file per run) reads the properties
back and prints, per bound: the runs that recorded it, the usual (median) and the
worst figure, the bound, and the margin: the distance from the usual figure to the
bound over the worst distance seen from the usual figure toward it. The rule holds
where that is at least 2. ``--check`` exits 1 where it does not, for a bound seen
in at least ``--runs`` runs (5).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

#: The JUnit property that carries one bound's figure: ``margin:NAME``.
PREFIX = "margin:"


@dataclass(frozen=True, slots=True)
class Bound:
    """One side or both of a bound: a figure inside it passes."""

    low: float | None = None
    high: float | None = None
    low_strict: bool = False
    high_strict: bool = False
    causal: bool = False

    def holds(self, figure: float) -> bool:
        if math.isnan(figure):
            return False
        if self.low is not None and (
            figure <= self.low if self.low_strict else figure < self.low
        ):
            return False
        return self.high is None or not (
            figure >= self.high if self.high_strict else figure > self.high
        )

    def text(self) -> str:
        sides = []
        if self.low is not None:
            sides.append(f"{'>' if self.low_strict else '>='} {self.low:g}")
        if self.high is not None:
            sides.append(f"{'<' if self.high_strict else '<='} {self.high:g}")
        return ", ".join(sides) + (" (causal)" if self.causal else "")

    def as_json(self, figure: float) -> str:
        return json.dumps(
            {
                "figure": figure,
                "low": self.low,
                "high": self.high,
                "low_strict": self.low_strict,
                "high_strict": self.high_strict,
                "causal": self.causal,
            }
        )


def bound(
    *,
    low: float | None = None,
    high: float | None = None,
    above: float | None = None,
    below: float | None = None,
    causal: bool = False,
) -> Bound:
    """A :class:`Bound` from the keywords of :class:`Margin`."""
    if low is not None and above is not None:
        raise TypeError("give low or above, not both")
    if high is not None and below is not None:
        raise TypeError("give high or below, not both")
    if low is None and above is None and high is None and below is None:
        raise TypeError("give a bound: low, above, high or below")
    return Bound(
        low=low if above is None else above,
        high=high if below is None else below,
        low_strict=above is not None,
        high_strict=below is not None,
        causal=causal,
    )


class Margin:
    """``margin(name, figure, low=..., high=..., above=..., below=...,
    causal=False, why="")``: records the figure and its bound on the running test,
    then fails the test if the figure is outside (the message names both, and
    ``why``)."""

    def __init__(self, node: pytest.Item) -> None:
        self._node = node

    def __call__(
        self,
        name: str,
        figure: float,
        *,
        low: float | None = None,
        high: float | None = None,
        above: float | None = None,
        below: float | None = None,
        causal: bool = False,
        why: object = "",
    ) -> None:
        limit = bound(low=low, high=high, above=above, below=below, causal=causal)
        if not self._record(name, figure, limit):
            pytest.fail(f"{name}: {figure:g}, outside {limit.text()}\n{why}".rstrip())

    def record(
        self,
        name: str,
        figure: float,
        *,
        low: float | None = None,
        high: float | None = None,
        above: float | None = None,
        below: float | None = None,
    ) -> bool:
        """Records as a call does, but only says whether the figure is inside (for
        a test that decides itself what a miss means)."""
        limit = bound(low=low, high=high, above=above, below=below)
        return self._record(name, figure, limit)

    def _record(self, name: str, figure: float, limit: Bound) -> bool:
        figure = float(figure)
        self._node.user_properties.append((PREFIX + name, limit.as_json(figure)))
        return limit.holds(figure)


# --- reading the runs back: scripts/margins ----------------------------------


@dataclass(slots=True)
class Seen:
    """One bound of one test across runs: its figures and the bound last seen."""

    bound: Bound
    figures: list[float] = field(default_factory=list)

    def usual(self) -> float:
        return statistics.median(self.figures)

    def worst(self) -> float:
        """The figure nearest the bound (below the usual for a low bound, above it
        for a high one; for both, the one farthest from the usual figure)."""
        b, usual = self.bound, self.usual()
        if b.high is None:
            return min(self.figures)
        if b.low is None:
            return max(self.figures)
        return max(self.figures, key=lambda f: abs(f - usual))

    def margin(self) -> float:
        """The distance from the usual figure to the bound, over the worst distance
        seen from the usual figure toward the bound (inf where none was seen)."""
        b, usual = self.bound, self.usual()
        ratios = []
        if b.low is not None:
            spread = usual - min(self.figures)
            ratios.append((usual - b.low) / spread if spread > 0 else math.inf)
        if b.high is not None:
            spread = max(self.figures) - usual
            ratios.append((b.high - usual) / spread if spread > 0 else math.inf)
        return min(ratios)


def read_runs(paths: Iterable[Path]) -> dict[tuple[str, str], Seen]:
    """Every ``margin:`` property of the JUnit files under ``paths`` (a folder per
    run, or files), by (test, bound name), in the order first seen."""
    seen: dict[tuple[str, str], Seen] = {}
    for path in paths:
        files = sorted(path.glob("*.xml")) if path.is_dir() else [path]
        for junit in files:
            for case in ET.parse(junit).getroot().iter("testcase"):
                test = f"{case.get('classname', '')}::{case.get('name', '')}"
                for prop in case.iter("property"):
                    name = prop.get("name", "")
                    if not name.startswith(PREFIX):
                        continue
                    data = json.loads(prop.get("value", "{}"))
                    limit = Bound(
                        low=data["low"],
                        high=data["high"],
                        low_strict=data["low_strict"],
                        high_strict=data["high_strict"],
                        causal=data["causal"],
                    )
                    key = (test.removeprefix("tests."), name.removeprefix(PREFIX))
                    entry = seen.setdefault(key, Seen(limit))
                    entry.bound = limit
                    entry.figures.append(float(data["figure"]))
    return seen


def verdict(entry: Seen, runs: int) -> str:
    if not all(entry.bound.holds(f) for f in entry.figures):
        return "FAILED"
    if entry.bound.causal:
        return "causal"
    ok = entry.margin() >= 2
    if len(entry.figures) < runs:
        return f"{'yes' if ok else 'no'} (runs < {runs})"
    return "yes" if ok else "NO"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/margins",
        description="Each timing bound's figures over runs, and whether the bound "
        "is at least twice the worst distance seen from the usual figure.",
    )
    parser.add_argument("junit", nargs="+", type=Path, help="a run's JUnit folder")
    parser.add_argument("--runs", type=int, default=5, help="runs a verdict needs")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if a bound breaks the rule"
    )
    args = parser.parse_args(argv)
    seen = read_runs(args.junit)
    rows = [("test", "bound name", "runs", "usual", "worst", "bound", "margin", "2x")]
    broken = False
    for (test, name), entry in seen.items():
        word = verdict(entry, args.runs)
        broken |= word in {"FAILED", "NO"}
        rows.append(
            (
                test,
                name,
                str(len(entry.figures)),
                f"{entry.usual():.4g}",
                f"{entry.worst():.4g}",
                entry.bound.text(),
                f"{entry.margin():.1f}",
                word,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))  # noqa: T201
    return 1 if broken and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
