"""docs/metrics.md carries the series reference generated from core/names.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from servemon.core import names
from servemon.core.reference import main, render, update

DOC = Path(__file__).resolve().parents[3] / "docs" / "metrics.md"


def test_the_committed_reference_is_current() -> None:
    assert main(["--check", str(DOC)]) == 0, (
        "run: python -m servemon.core.reference docs/metrics.md"
    )


def test_every_series_is_in_the_reference_once() -> None:
    block = render()
    for series in names.SCHEMA:
        assert block.count(f"`{series.name}`") == 1


def test_a_stale_reference_is_caught(tmp_path: Path) -> None:
    stale = tmp_path / "metrics.md"
    stale.write_text(update(DOC.read_text()).replace("counter", "gauge", 1))
    assert main(["--check", str(stale)]) == 1
    assert main([str(stale)]) == 0
    assert main(["--check", str(stale)]) == 0


def test_names_follow_prometheus_conventions() -> None:
    seen = set()
    for series in names.SCHEMA:
        assert series.name.startswith("servemon_")
        assert series.name not in seen
        seen.add(series.name)
        if series.kind == "counter":
            assert series.name.endswith("_total")
        if series.unit == "seconds":
            # a counter of seconds ends in _seconds_total (process_cpu_seconds_total)
            assert series.name.removesuffix("_total").endswith("_seconds")


def test_missing_markers_are_an_error() -> None:
    with pytest.raises(ValueError, match="markers"):
        update("no markers here")


def test_every_source_gives_its_series_every_label() -> None:
    common = {"target", "model", "engine", "rank"}
    for series in names.ENGINE_SERIES:
        extra = [label for label in series.labels if label not in common]
        for src in series.sources:
            if src.read != "value":
                continue  # read from the newest sample's labels (LoRA)
            assert [ours for ours, _, _ in src.keep] == extra, (series.name, src)
