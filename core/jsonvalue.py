"""The types of JSON values: what a JSON decoder gives and a JSON encoder takes.

A value decoded from the network or from a file is a :data:`JSONValue` until it is
read: a reader narrows it with ``isinstance`` (a dict is a :data:`JSONObject`), so
a field of the wrong type is found where it is read, not deeper in. A mapping only
written out (a run record's line, a rules file) is a :data:`JSONObject` when it is
built here and read back by key, or a ``Mapping[str, object]`` where it is only
passed on to the encoder. :func:`as_float` reads a decoded number as ``float()``
does.
"""

from __future__ import annotations

from typing import TypeAlias

__all__ = ["JSONArray", "JSONObject", "JSONValue", "as_float"]

#: A JSON value of any kind (a scalar, an array, an object), as ``json.loads``
#: builds it.
JSONValue: TypeAlias = (
    "str | int | float | bool | list[JSONValue] | dict[str, JSONValue] | None"
)
#: A JSON object, as ``json.loads`` builds it.
JSONObject: TypeAlias = dict[str, JSONValue]
#: A JSON array, as ``json.loads`` builds it.
JSONArray: TypeAlias = list[JSONValue]


def as_float(value: object) -> float:
    """A decoded number (or numeric string) as ``float()`` reads it; a TypeError
    for anything else, as ``float()`` raises for a list, an object or ``null``."""
    if isinstance(value, int | float | str):
        return float(value)
    raise TypeError(f"expected a number, got {type(value).__name__}")
