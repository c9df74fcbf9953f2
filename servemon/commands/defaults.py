"""What ``--help`` shows as each option's default: the config's, read from the
dataclass that declares it (the one home of a default), never written in a help."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import click

__all__ = ["fill_defaults"]

_DEFAULT = re.compile(r"\[default: [^\]]*\]")


def _shown(value: Any, option: click.Option) -> str:
    """A config default as a flag writes it."""
    if isinstance(value, bool) and option.secondary_opts:
        return (option.opts if value else option.secondary_opts)[0]
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple | list):
        values = [_shown(v, option) for v in value]
        return values[0] if len(set(values)) == 1 else " ".join(values)
    return str(value)


def fill_defaults(command: click.Command, *configs: type) -> click.Command:
    """Show each option's default as ``configs`` (the command's own section first,
    then the settings it shares) declare it: the one home of a default, which
    ``--help`` only reads (a help that writes one is refused, at import). An option
    whose field defaults to None (decided later: "the profile's", "1 or --rps-min")
    keeps the words its help gives."""
    fields = {f.name: (c, f) for c in reversed(configs) for f in dataclasses.fields(c)}
    for param in command.params:
        found = fields.get(param.name or "")
        if not isinstance(param, click.Option) or found is None:
            continue
        config, field = found
        if field.default is not dataclasses.MISSING:
            value = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            continue
        if value is None or value == ():
            continue
        text = param.help or ""
        if _DEFAULT.search(text):
            raise ValueError(
                f"{param.opts[0]}: its default is {config.__name__}.{field.name}'s; "
                "the help must not write it"
            )
        param.help = f"{text} [default: {_shown(value, param)}]"
    return command
