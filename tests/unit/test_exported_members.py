"""Every module's public surface is its ``__all__``: present, sorted, all defined.

As httpx checks its exported members: a name added to a module without a thought for
whether it is public, or an ``__all__`` naming something that moved, fails here.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import pytest

ROOT = "servemon"
#: Modules that are programs rather than libraries: nothing to export.
NO_EXPORTS = {"servemon.core.reference"}


def _walk() -> dict[str, bool]:
    """Every module under the one import root, and whether it is a package."""
    found = {ROOT: True}
    root = importlib.import_module(ROOT)
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{ROOT}."):
        if not info.name.endswith(".__main__"):  # importing it runs the CLI
            found[info.name] = info.ispkg
    return found


MODULES = _walk()
PACKAGES = {name for name, is_package in MODULES.items() if is_package}


def modules() -> list[str]:
    return sorted(MODULES)


@pytest.mark.parametrize("name", modules())
def test_all_is_defined_and_names_only_what_exists(name: str) -> None:
    module: ModuleType = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    if exported is None:
        assert name in NO_EXPORTS or name in PACKAGES, f"{name} has no __all__"
        return
    missing = [item for item in exported if not hasattr(module, item)]
    assert not missing, f"{name}.__all__ names what it lacks: {missing}"
    assert len(set(exported)) == len(exported), f"{name}.__all__ repeats a name"
    # Sorted as ruff's RUF022 sorts (constants, classes, then functions: "isort
    # style"): upper-case names first, then by the name itself.
    expected = sorted(exported, key=_isort_key)
    assert list(exported) == expected, f"{name}.__all__ is not sorted: {expected}"


def _isort_key(item: str) -> tuple[int, str]:
    if item.isupper():
        return (0, item)
    if item[:1].isupper():
        return (1, item)
    return (2, item)
