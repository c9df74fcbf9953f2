"""How much of the package is typed ``Any`` (issue #43), held under a ceiling.

``Any`` is allowed for JSON values read from the network or from files, at the
point where they are decoded (``json.loads``, ``orjson.loads``, YAML, a run
record's file), and for what an untyped library hands over. Everywhere else a
value has its type: a JSON value is a :data:`servemon.core.jsonvalue.JSONValue`
narrowed with ``isinstance`` where it is read, a fixed-shape mapping read back by
key is a ``TypedDict``, a mapping only written out is ``dict[str, object]`` or
``Mapping[str, object]``, a callback has its exact signature.

The count is every use of the name ``Any`` (``Any`` or ``typing.Any``) in the
package's code, imports left out; comments and docstrings do not count. Lower
:data:`CEILING` when the count falls; never raise it.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The package's folders; ``servemon/``'s links to the parts are walked through
#: the parts' own folders.
FOLDERS = ("core", "loadgen", "monitor", "dashboards", "simulator", "servemon")
#: The most uses of ``Any`` the package may hold.
CEILING = 108
#: How many of the files with the most a failure names.
SHOWN = 10


def _files() -> list[Path]:
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT).parts
            if parts[0] == "servemon" and len(parts) > 2 and parts[1] in FOLDERS:
                continue  # a link to a part: counted in the part's own folder
            found.append(path)
    return found


def _uses(path: Path) -> int:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return sum(
        1
        for node in ast.walk(tree)
        if (isinstance(node, ast.Name) and node.id == "Any")
        or (isinstance(node, ast.Attribute) and node.attr == "Any")
    )


def any_counts() -> Counter[str]:
    """Uses of ``Any`` per file of the package, by path from the repository root."""
    counts: Counter[str] = Counter()
    for path in _files():
        if used := _uses(path):
            counts[str(path.relative_to(ROOT))] = used
    return counts


def test_any_stays_under_the_ceiling() -> None:
    counts = any_counts()
    total = sum(counts.values())
    most = ", ".join(f"{name} {n}" for name, n in counts.most_common(SHOWN))
    assert total <= CEILING, (
        f"{total} uses of Any in the package, over the ceiling of {CEILING}; "
        f"the files with the most: {most}. Type the values instead (see this "
        "test's docstring for what may stay Any)."
    )


def test_the_count_sees_the_package() -> None:
    counts = any_counts()
    assert len(_files()) > 100
    assert "core/fields.py" in counts  # read_yaml: a decoded YAML mapping
