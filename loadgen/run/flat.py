"""A load run's config as users write it: flat keys, the flags' names with
underscores, in a YAML file and on the command line, for a config that keeps a
command's own flags in its section (:data:`~servemon.loadgen.run.sections.SECTIONS`).

:func:`config_of` is the one place flat keys become a config, and
:func:`config_text` the one place a config becomes flat keys again (what
``run.json`` keeps, as it always has).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pydantic

from servemon.core.errors import ConfigError
from servemon.core.fields import load, merge
from servemon.loadgen.run.config import LoadConfig
from servemon.loadgen.run.sections import SECTIONS, Kind, refusal
from servemon.loadgen.send.arrivals import stages_text

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["config_of", "config_text"]

#: The flags every command shares.
_TOP = {f.name for f in dataclasses.fields(LoadConfig)} - set(SECTIONS)


def config_of(kind: Kind, *layers: tuple[str, Mapping[str, Any]]) -> LoadConfig:
    """The one place flat keys (YAML's, the flags') become ``kind``'s config:
    defaults, then each layer (its source, as an error names it, and its keys)
    over the one below; a ``None`` is "not given". A key of ``kind``'s section
    goes into it, any other to the top level; a key of another command's section
    is a one-line error naming the flag and the commands that take it."""
    own = SECTIONS[kind]
    mine = _names(own)
    config, section, source = LoadConfig(), dict[str, Any](), "config"
    for source, flat in layers:
        top = {}
        for key, value in flat.items():
            if value is None:
                continue
            if key in mine:
                section[key] = _checked(own, key, value, source)
            else:
                _refuse_others(kind, key, source)
                top[key] = value
        config = merge(config, top, source)
    if _complete(own, section):
        config = merge(config, {kind: load(own, section, source)}, source)
    config.check_section(kind)  # a required flag not given: one line naming it
    return config


def _complete(section: type[DataclassInstance], given: Mapping[str, Any]) -> bool:
    return all(
        f.name in given
        for f in dataclasses.fields(section)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )


def _checked(section: type, key: str, value: Any, source: str) -> Any:
    """A section's value of one layer, parsed into its type (the section is built
    once every layer is in: the layer below may hold what it needs)."""
    hint = typing.get_type_hints(section, include_extras=True)[key]
    try:
        return pydantic.TypeAdapter(hint).validate_python(value)
    except pydantic.ValidationError as exc:
        message = exc.errors()[0]["msg"]
        raise ConfigError(f"{source}: {key}: {message} (got {value!r})") from None


def _refuse_others(kind: Kind, key: str, source: str) -> None:
    if key in SECTIONS:  # a section is given by its flat keys, never as one
        raise ConfigError(f"{source}: {key}: unknown field")
    if key in _TOP:
        return
    if any(key in _names(c) for c in SECTIONS.values()):
        raise ConfigError(f"{source}: {refusal(key, kind)}")


def _names(cls: type[DataclassInstance]) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def config_text(config: LoadConfig) -> dict[str, Any]:
    """The config as plain data, flat as the flags are (a section's fields among
    the others'; those of a section the run has not, None), each parsed flag in
    its own text again: what a run record keeps, and what :func:`config_of` reads
    back."""
    data = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    for name, cls in SECTIONS.items():
        section = data.pop(name)
        for f in dataclasses.fields(cls):
            if section is not None:
                data[f.name] = getattr(section, f.name)
            else:
                data.setdefault(f.name, None)
    stages, start_at = data["stages"], config.start_at
    data["stages"] = None if stages is None else stages_text(stages)
    tiers = [str(t) for t in config.slo]
    data["slo"] = None if not tiers else tiers[0] if len(tiers) == 1 else tiers
    data["select"] = ",".join(config.select) or None
    data["start_at"] = None if start_at is None else start_at.isoformat()
    for key in ("arrival", "workload", "energy", "model", "hold", "shard"):
        data[key] = None if data[key] is None else str(data[key])
    for key in ("header", "parallel", "number", "sim_args"):
        data[key] = None if data[key] is None else list(data[key])
    return data
