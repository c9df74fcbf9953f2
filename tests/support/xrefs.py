"""Cross-references to servemon's modules, found, resolved and respelled (#43).

The parts (``core``, ``monitor``, ``loadgen``, ``dashboards``, ``simulator``) keep
their top-level folders and are imported as ``servemon.<part>`` only; a reference
spelled from a part's folder (``<part>.run.context``) names a module that does not
import. This module finds every reference:

- a Sphinx role (``:mod:``, ``:func:``, ``:class:``, ``:meth:``, ``:data:``,
  ``:attr:``, ``:exc:``, ``:obj:``, ``:const:``; with or without ``~``) in a Python
  file; in the package it may be relative (``.worker``, ``Drive``, ``Drive.run``)
  and is resolved against the module and the classes it appears in;
- a double-backticked dotted name in a Python file, and a backticked one in
  ``docs/*.md`` and ``README.md``, that starts with ``servemon.`` or a part's name.

:func:`resolve` imports the longest importable prefix and reads the rest as
attributes. ``tests/unit/test_references.py`` checks that every reference is spelled
``servemon.…`` (or relative) and resolves; ``scripts/xrefs`` (this module's
:func:`main`) respells the bare ones in place, and is idempotent.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import re
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.oneroot import PARTS

ROOT = Path(__file__).resolve().parents[2]
ROOT_PACKAGE = "servemon"
ROLES = ("mod", "func", "class", "meth", "data", "attr", "exc", "obj", "const")
#: ``:role:`target```, ``:role:`~target``` or ``:role:`title <target>```.
ROLE = re.compile(rf":(?:py:)?(?:{'|'.join(ROLES)}):`([^`<]*<)?(~?)([^`<>]+)(>?)`")
_HEAD = "|".join((ROOT_PACKAGE, *PARTS))
#: A dotted name in a literal, from ``servemon`` or a part, then an optional call.
DOTTED = re.compile(rf"((?:{_HEAD})(?:\.[A-Za-z_]\w*)+)(?:\(.*)?")
LITERAL_PY = re.compile(r"``([^`\n]+)``")
LITERAL_MD = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
FENCE = re.compile(r"^\s*(```|~~~)")
#: A dotted name ending in one of these is a file, not a module.
FILE_SUFFIXES = {"md", "py", "json", "yaml", "yml", "toml", "txt", "jsonl", "csv"}
#: Where the repository's own text lives (the parts through their own folders).
PYTHON_DIRS = (ROOT_PACKAGE, *PARTS, "tests", "benchmarks")
SCRIPTS = ROOT / "scripts"
#: Files that write bare references on purpose: the examples of the respelling.
EXAMPLES = {ROOT / "tests/support/xrefs.py", ROOT / "tests/unit/test_references.py"}


@dataclass(frozen=True, slots=True)
class Reference:
    """One cross-reference: where it is, the name as written and its context."""

    path: Path
    line: int
    name: str
    #: The module it appears in, for a relative name (package files only).
    module: str | None = None
    #: The classes around it, outermost first (``Drive.run`` inside ``Drive``).
    classes: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}: {self.name}"

    @property
    def bare(self) -> bool:
        """Spelled from a part's folder, not from ``servemon``."""
        return self.name.split(".")[0] in PARTS


def python_files() -> Iterator[Path]:
    """The repository's Python files (the links in ``servemon/`` not walked twice,
    scripts without a suffix recognized by their ``python`` shebang)."""
    for folder in PYTHON_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).parts
            if rel[0] == ROOT_PACKAGE and len(rel) > 2 and rel[1] in PARTS:
                continue
            if path not in EXAMPLES:
                yield path
    for path in sorted(SCRIPTS.iterdir()):
        if path.is_file() and (
            path.suffix == ".py"
            or path.read_bytes()[:64].split(b"\n")[0].endswith((b"python", b"python3"))
        ):
            yield path


def markdown_files() -> list[Path]:
    return [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]


def module_name(path: Path) -> str | None:
    """``servemon.<…>`` for a file of the package, else None."""
    rel = path.relative_to(ROOT).with_suffix("").parts
    if rel[0] in PARTS:
        rel = (ROOT_PACKAGE, *rel)
    elif rel[0] != ROOT_PACKAGE:
        return None
    if rel[-1] == "__init__":
        rel = rel[:-1]
    return ".".join(rel)


def _literal(text: str) -> str | None:
    match = DOTTED.fullmatch(text.strip())
    if match is None or match.group(1).rsplit(".", 1)[1] in FILE_SUFFIXES:
        return None
    return match.group(1)


def _classes_by_line(tree: ast.Module) -> dict[int, tuple[str, ...]]:
    out: dict[int, tuple[str, ...]] = {}

    def visit(node: ast.AST, outer: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                inner = (*outer, child.name)
                for line in range(child.lineno, (child.end_lineno or 0) + 1):
                    out[line] = inner
                visit(child, inner)
            else:
                visit(child, outer)

    visit(tree, ())
    return out


def python_references(path: Path) -> Iterator[Reference]:
    text = path.read_text(encoding="utf-8")
    module = module_name(path)
    classes = _classes_by_line(ast.parse(text)) if module else {}
    for number, line in enumerate(text.splitlines(), 1):
        for match in ROLE.finditer(line):
            name = match.group(3).removesuffix("()")
            if module is None and _literal(name) is None:
                continue  # outside the package only the absolute names are read
            yield Reference(path, number, name, module, classes.get(number, ()))
        for match in LITERAL_PY.finditer(line):
            if (name := _literal(match.group(1))) is not None:
                yield Reference(path, number, name)


def markdown_references(path: Path) -> Iterator[Reference]:
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        for match in LITERAL_MD.finditer(line):
            if (name := _literal(match.group(1))) is not None:
                yield Reference(path, number, name)


def references() -> list[Reference]:
    found = [r for p in python_files() for r in python_references(p)]
    return found + [r for p in markdown_files() for r in markdown_references(p)]


def _instance_attributes(cls: type) -> set[str]:
    """The names a class's methods assign on ``self``."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return set()
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }


def _has(obj: object, attr: str) -> bool:
    """An attribute; a field declared by annotation only (a dataclass field without
    a default, a TypedDict key, a module's ``#:`` annotated name); or an instance
    attribute a method assigns."""
    if hasattr(obj, attr):
        return True
    owners = inspect.getmro(obj) if inspect.isclass(obj) else (obj,)
    if any(attr in getattr(owner, "__annotations__", {}) for owner in owners):
        return True
    return any(attr in _instance_attributes(o) for o in owners if o is not object)


def lookup(dotted: str) -> bool:
    """Import the longest importable prefix of ``dotted``; read the rest as
    attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for index, attr in enumerate(parts[cut:], cut):
            if not _has(obj, attr):
                return False
            if index < len(parts) - 1:
                obj = getattr(obj, attr)
        return True
    return False


def candidates(ref: Reference) -> list[str]:
    """The absolute names ``ref`` may stand for, first match wins (as Sphinx)."""
    name = ref.name
    if ref.module is None:
        return [name]
    if name.startswith("."):
        rest = name.lstrip(".")
        package = ref.module
        if ref.path.name != "__init__.py":
            package = package.rpartition(".")[0]
        for _ in range(len(name) - len(rest) - 1):
            package = package.rpartition(".")[0]
        return [f"{package}.{rest}", f"{ref.module}.{rest}"]
    scopes = [".".join(ref.classes[:i]) for i in range(len(ref.classes), 0, -1)]
    found = [f"{ref.module}.{scope}.{name}" for scope in scopes]
    found += [f"{ref.module}.{name}", name]
    if "." not in name:
        found.append(f"builtins.{name}")
    return found


def resolve(ref: Reference) -> str | None:
    """The absolute name ``ref`` resolves to, or None."""
    return next((c for c in candidates(ref) if lookup(c)), None)


def respell(text: str, *, markdown: bool) -> tuple[str, int]:
    """``text`` with every bare part reference spelled from ``servemon``; and how
    many were respelled."""
    count = 0

    def role(match: re.Match[str]) -> str:
        nonlocal count
        title, tilde, name, close = match.groups()
        if name.split(".")[0] not in PARTS:
            return match.group(0)
        count += 1
        head = match.group(0)[: match.start(1 if title else 2) - match.start(0)]
        return f"{head}{title or ''}{tilde}{ROOT_PACKAGE}.{name}{close}`"

    def literal(match: re.Match[str]) -> str:
        nonlocal count
        name = _literal(match.group(1))
        if name is None or name.split(".")[0] not in PARTS:
            return match.group(0)
        count += 1
        return match.group(0).replace(name, f"{ROOT_PACKAGE}.{name}", 1)

    lines = text.splitlines(keepends=True)
    fenced = False
    for index, line in enumerate(lines):
        if markdown:
            if FENCE.match(line):
                fenced = not fenced
            if fenced or FENCE.match(line):
                continue
            lines[index] = LITERAL_MD.sub(literal, line)
        else:
            lines[index] = LITERAL_PY.sub(literal, ROLE.sub(role, line))
    if markdown or not count:
        return "".join(lines), count
    changed = [i for i, line in enumerate(text.splitlines(True)) if lines[i] != line]
    return rewrap(lines, changed, prose_lines(text)), count


#: A word of prose: a run of non-blanks, a backticked span kept whole.
WORD = re.compile(r"(?:[^\s`]|``[^`]*``|`[^`]*`)+")
LIMIT = 88


def prose_lines(text: str) -> set[int]:
    """The indices of the lines of ``text`` that are comments or docstrings."""
    lines = text.splitlines()
    out = {i for i, line in enumerate(lines) if line.lstrip().startswith("#")}
    for node in ast.walk(ast.parse(text)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            out |= set(range(node.lineno - 1, node.end_lineno or node.lineno))
    return out


def _margin(line: str) -> tuple[str, str]:
    """A prose line's margin (indent, ``#``/``#:``, opening quotes, a list item's
    dash) and the margin its continuation lines have."""
    body = line.lstrip()
    indent = line[: len(line) - len(body)]
    comment = re.match(r"#:? ?", body)
    if comment:
        return indent + comment.group(0), indent + comment.group(0)
    quote = re.match(r"[rbuf]*(\"\"\"|''')", body)
    first = indent + (quote.group(0) if quote else "")
    item = re.match(r"[-*] ", line[len(first) :])
    hanging = indent + ("  " if item else "")
    return first + (item.group(0) if item else ""), hanging


def rewrap(lines: list[str], changed: list[int], prose: set[int]) -> str:
    """Push the words past :data:`LIMIT` on each changed prose line to the start of
    the next line of its paragraph (a new line if it has none), and on down; every
    other line break is kept."""
    todo = sorted(changed)
    while todo:
        i = todo.pop(0)
        line = lines[i].rstrip("\n")
        if i not in prose or len(line) <= LIMIT:
            continue
        first, hanging = _margin(line)
        words = [m.group(0) for m in WORD.finditer(line[len(first) :])]
        keep: list[str] = []
        while words and len(first + " ".join([*keep, words[0]])) <= LIMIT:
            keep.append(words.pop(0))
        if not keep or not words:
            continue  # one word too long for any line: left as it is
        lines[i] = first + " ".join(keep) + "\n"
        following = lines[i + 1].rstrip("\n") if i + 1 < len(lines) else ""
        rest = following[len(hanging) :]
        continues = (
            i + 1 in prose
            and following.startswith(hanging)
            and rest[:1] not in ("", " ", "-", "*", "#", '"', "'")
            and not re.match(r"\.\. |:\w[^:`]*: ", rest)  # a directive, a field
            and _margin(following)[0] == hanging
        )
        if continues:
            lines[i + 1] = hanging + " ".join([*words, rest]) + "\n"
        else:
            lines.insert(i + 1, hanging + " ".join(words) + "\n")
            prose = {j + (j > i) for j in prose} | {i + 1}
            todo = [j + (j > i) for j in todo]
        todo = sorted({*todo, i + 1})
    return "".join(lines)


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/xrefs",
        description="Respell bare part references (loadgen.x -> servemon.loadgen.x) "
        "in docstrings, docs/*.md and README.md, in place; then list what does "
        "not resolve.",
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if any is bare"
    )
    args = parser.parse_args(argv)
    total = 0
    for path in [*python_files(), *markdown_files()]:
        text = path.read_text(encoding="utf-8")
        new, count = respell(text, markdown=path.suffix == ".md")
        if count:
            total += count
            _say(f"{path.relative_to(ROOT)}: {count}")
            if not args.check:
                path.write_text(new, encoding="utf-8")
    verb = "bare" if args.check else "respelled"
    _say(f"{total} references {verb}")
    if args.check:
        return 1 if total else 0
    sys.path.insert(0, str(ROOT))
    unresolved = [r for r in references() if resolve(r) is None]
    for ref in unresolved:
        _say(f"does not resolve: {ref}")
    return 1 if unresolved else 0


if __name__ == "__main__":
    sys.exit(main())
