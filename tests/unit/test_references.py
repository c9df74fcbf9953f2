"""Every cross-reference to servemon's code names a module or object that imports.

A reference is a Sphinx role in a docstring or ``#:`` comment (``:mod:``,
``:func:``, ``:class:``, …), a double-backticked dotted name in Python, or a
backticked one in ``docs/*.md`` and ``README.md`` (tests/support/xrefs.py). It is
spelled from the one import root, ``servemon``, or relative to the module it is
in; ``scripts/xrefs`` respells a bare part name in place.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.xrefs import PARTS, Reference, references, resolve, respell

REFERENCES = references()


def test_references_are_found() -> None:
    """The scan reads roles, literals and the docs (a broken regex finds nothing)."""
    assert len(REFERENCES) > 500
    suffixes = {ref.path.suffix for ref in REFERENCES}
    assert {".py", ".md"} <= suffixes


def test_references_are_spelled_from_servemon() -> None:
    bare = [str(ref) for ref in REFERENCES if ref.bare]
    assert not bare, f"spell these servemon.<part>… (run scripts/xrefs): {bare}"


def test_references_resolve() -> None:
    unresolved = [str(ref) for ref in REFERENCES if resolve(ref) is None]
    assert not unresolved, f"references that do not import: {unresolved}"


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (":mod:`loadgen.run`", ":mod:`servemon.loadgen.run`"),
        (":func:`~core.fields.load`", ":func:`~servemon.core.fields.load`"),
        (":class:`the run <loadgen.X>`", ":class:`the run <servemon.loadgen.X>`"),
        ("``monitor.gpu.GpuReader``", "``servemon.monitor.gpu.GpuReader``"),
        (":mod:`servemon.loadgen`", ":mod:`servemon.loadgen`"),
        (":class:`.Drive`", ":class:`.Drive`"),
        ("``loadgen/run/x.py``", "``loadgen/run/x.py``"),
        ("``core.names.py``", "``core.names.py``"),
    ],
)
def test_respell(before: str, after: str) -> None:
    text, count = respell(f'"""{before}"""\n', markdown=False)
    assert text == f'"""{after}"""\n'
    assert count == (before != after)
    assert respell(text, markdown=False) == (text, 0)  # idempotent


def test_respell_rewraps_what_it_lengthens() -> None:
    """Words past the line length go to the start of the paragraph's next line."""
    words = "x " * 39 + "x"
    text, _ = respell(f'"""{words} :mod:`loadgen.run`\nend."""\n', markdown=False)
    assert text == f'"""{words}\n:mod:`servemon.loadgen.run` end."""\n'


def test_respell_markdown_leaves_code_blocks() -> None:
    text = "`monitor.gpu` and\n```\nmonitor.gpu\n```\n"
    assert respell(text, markdown=True) == (
        "`servemon.monitor.gpu` and\n```\nmonitor.gpu\n```\n",
        1,
    )


def test_relative_references_resolve_in_their_module() -> None:
    here = Path(__file__)
    ref = Reference(here, 1, "Drive.signals", "servemon.loadgen.run.context")
    assert resolve(ref) == "servemon.loadgen.run.context.Drive.signals"
    ref = Reference(here, 1, ".context", "servemon.loadgen.run.plan")
    assert resolve(ref) == "servemon.loadgen.run.context"
    assert resolve(Reference(here, 1, f"{PARTS[0]}.errors")) is None
