"""``servemon exporter --fake-gpu``, ``--fake-gpus N`` and ``--fake-gpu-watts W``:
made-up GPUs at a known power, for demos and for tests of energy per token."""

from __future__ import annotations

from servemon.commands.exporter import _fake_reader, exporter
from servemon.monitor.fakegpu import DEMO_WATTS


def _help(name: str) -> str:
    (param,) = [p for p in exporter.params if p.name == name]
    return getattr(param, "help", None) or ""


def test_no_fake_option_is_no_fake_reader() -> None:
    assert _fake_reader(None) is None


def test_the_fake_gpus_draw_the_demo_power_unless_told() -> None:
    reader = _fake_reader((2, None))
    assert reader is not None
    snapshot = reader.read()
    assert [g.index for g in snapshot.gpus] == [0, 1]
    assert {g.power_watts for g in snapshot.gpus} == {DEMO_WATTS}
    told = _fake_reader((1, 450.0))
    assert told is not None
    assert [g.power_watts for g in told.read().gpus] == [450.0]


def test_the_help_shows_the_defaults_the_code_uses() -> None:
    assert f"[default: {DEMO_WATTS:g}]" in _help("fake_gpu_watts")
    assert "[default: 1]" in _help("fake_gpus")
