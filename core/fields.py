"""Validate configuration mappings (YAML, JSON, flags) into frozen dataclasses.

Validation happens at the edges only. :func:`load` turns a mapping into a dataclass
through pydantic and reports the first problem as one line naming the source and the
dotted field. :func:`merge` lays a mapping over a config dataclass, and
:func:`layer_config` is the one way a command builds its config: the dataclass's
defaults, then the YAML file of ``--config``, then the flags given. This module
imports nothing of servemon's own but the errors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pydantic
import yaml

from servemon.core.errors import ConfigError

__all__ = ["FORBID_EXTRA", "Secret", "layer_config", "load", "merge", "read_yaml"]

#: Put ``__pydantic_config__ = FORBID_EXTRA`` in a config dataclass to reject
#: unknown fields.
FORBID_EXTRA = pydantic.ConfigDict(extra="forbid")

T = TypeVar("T")


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML file whose top level is a mapping; an empty file is ``{}``."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{path}:{where}: {problem}") from exc
    except RecursionError:  # PyYAML composes nested collections recursively
        raise ConfigError(f"{path}: YAML nested too deeply") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected a mapping at the top level, got {type(data).__name__}"
        )
    return data


def load(cls: type[T], data: Mapping[str, object], source: str) -> T:
    """Build ``cls`` (a dataclass) from ``data``; raise a one-line ConfigError."""
    try:
        return pydantic.TypeAdapter(cls).validate_python(dict(data))
    except pydantic.ValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        loc = _field_path(first["loc"])
        where = ".".join(str(part) for part in loc) or "(top level)"
        # A value that fits no member of a union (``4`` or ``auto``): every
        # member's complaint, in one line.
        messages = [e["msg"] for e in errors if _field_path(e["loc"]) == loc]
        message = " or ".join(dict.fromkeys(messages))
        got = first.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r})"
        raise ConfigError(f"{source}: {where}: {message}{shown}") from None


def _field_path(loc: Sequence[int | str]) -> tuple[int | str, ...]:
    """A validation error's location without pydantic's union-member tags
    (``constrained-int``, ``literal['auto']``): field names and indices only."""
    return tuple(p for p in loc if isinstance(p, int) or p.isidentifier())


def merge(
    base: T, overrides: Mapping[str, object], source: str, *, skip_none: bool = True
) -> T:
    """``base`` (a config dataclass) with ``overrides`` laid over it, validated again.

    A ``None`` override means "not given" and is skipped unless ``skip_none`` is
    false. A mapping given for a field that holds a dataclass (the simulator's
    ``faults``) is laid over that dataclass field by field; a string (a flag's text
    that the field's type parses, such as ``--arrival gamma:2``) or a value of the
    type replaces it. An unknown field, like any invalid value, is a one-line
    :class:`ConfigError` naming ``source`` and the dotted field; ``base`` is never
    changed.
    """
    data = _overlay(base, overrides, f"{source}: ", skip_none)
    return load(type(base), data, source)


def _overlay(
    base: object, overrides: Mapping[str, object], where: str, skip_none: bool
) -> dict[str, object]:
    # One level only: a field's value stays what it is (a parsed workload, a hold,
    # an arrival); a sub-config the overrides reach into is laid over below.
    if not dataclasses.is_dataclass(base):
        raise TypeError(f"{where}not a dataclass: {type(base).__name__}")
    data = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    for key, value in overrides.items():
        if value is None and skip_none:
            continue
        if key not in data:
            raise ConfigError(f"{where}{key}: unknown field")
        current = getattr(base, key)
        if (
            dataclasses.is_dataclass(current)
            and not isinstance(current, type)
            and not isinstance(value, str | type(current))
        ):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{where}{key}: expected a mapping")
            data[key] = _overlay(current, value, f"{where}{key}.", skip_none)
        else:
            data[key] = value
    return data


def layer_config(
    cls: type[T], config_file: Path | None, flags: Mapping[str, object]
) -> T:
    """A command's config: ``cls``'s defaults, then ``config_file``, then ``flags``.

    ``flags`` are the command's options by field name, as click gives them: ``None``
    and ``()`` (an option or a repeatable option not given) leave the value below.
    """
    config = cls()
    if config_file is not None:
        config = merge(config, read_yaml(config_file), str(config_file))
    given = {k: v for k, v in flags.items() if v is not None and v != ()}
    return merge(config, given, "command line")


class Secret:
    """A secret value (API key, auth header) that never prints.

    ``str()``, ``repr()`` and formatting give ``<redacted>``; only :meth:`reveal`
    returns the value, and only where a request header is built.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The value itself."""
        return self._value

    def __repr__(self) -> str:
        return "Secret(<redacted>)"

    def __str__(self) -> str:
        return "<redacted>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)
