"""The one import root, held where the repository's own code runs.

The parts (``core``, ``monitor``, ``loadgen``, ``dashboards``, ``simulator``) keep
their top-level folders and are imported through ``servemon`` only
(docs/architecture.md). In a checkout their folders also sit on the path (the
editable install puts the root there), where a bare ``import monitor`` would load
a second copy of each module: a second ``ServemonError`` class that an ``except``
does not catch, a monkeypatch of the copy that patches nothing. The tests
(tests/conftest.py) and the benchmarks (benchmarks/_common.py) install
:class:`OneRoot`, so such an import fails at the line that asks for it;
tests/unit/test_layout.py finds any written one first. It lives here, not in the
package: an installed servemon has no second name to refuse.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any

#: The parts, imported as ``servemon.<part>`` only.
PARTS = ("core", "monitor", "loadgen", "dashboards", "simulator")


class OneRoot(importlib.abc.MetaPathFinder):
    """Refuses a bare part name, at the line that asks for it."""

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if path is None and fullname in PARTS:
            raise ImportError(f"import servemon.{fullname}, not {fullname}")
        return None


def install() -> None:
    """Put :class:`OneRoot` first on ``sys.meta_path`` (once per process)."""
    if not any(isinstance(finder, OneRoot) for finder in sys.meta_path):
        sys.meta_path.insert(0, OneRoot())
