"""Grafana's published dashboard schema as a validator of dashboard JSON.

``tests/data/grafana/`` holds the schema ``scripts/grafana-schema`` extracts from the
``@grafana/schema`` npm package (``version.json`` names the version and the
``schemaVersion`` it writes): the dashboard, and one file per panel plugin with the
plugin's ``Options`` and custom ``FieldConfig``. :func:`dashboard_errors` checks the
envelope, every panel (rows' panels too) and each panel's options and custom field
config against its plugin's schema, with the ``jsonschema`` package; a panel type
without a vendored plugin schema is an error, so a new kind of panel gets its schema
added rather than going unchecked.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft7Validator
from jsonschema.exceptions import ValidationError, best_match

__all__ = ["DATA", "dashboard_errors", "schema_version"]

DATA = Path(__file__).resolve().parents[1] / "data" / "grafana"


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def schema_version() -> int:
    """The ``schemaVersion`` the vendored package writes."""
    return int(_load(DATA / "version.json")["schemaVersion"])


@cache
def _dashboard() -> Draft7Validator:
    schema = _load(DATA / "dashboard.schema.json")
    Draft7Validator.check_schema(schema)
    return Draft7Validator(schema)


@cache
def _plugin(kind: str, definition: str) -> Draft7Validator | None:
    """A validator of the plugin ``kind``'s ``definition``; None if it has none."""
    path = DATA / "panels" / f"{kind}.schema.json"
    if not path.exists():
        raise KeyError(kind)
    definitions = _load(path)["definitions"]
    if definition not in definitions:
        return None
    schema = {"$ref": f"#/definitions/{definition}", "definitions": definitions}
    Draft7Validator.check_schema(schema)
    return Draft7Validator(schema)


def _branch(error: ValidationError) -> list[ValidationError]:
    """The errors of an anyOf of a panel or a row under the branch its type picks."""
    if error.validator != "anyOf" or not isinstance(error.instance, dict):
        return [error]
    want = "RowPanel" if error.instance.get("type") == "row" else "Panel"
    refs = [branch.get("$ref", "") for branch in error.validator_value]
    if f"#/definitions/{want}" not in refs:
        return [error]
    index = refs.index(f"#/definitions/{want}")
    return [e for e in error.context or [] if e.relative_schema_path[0] == index]


def _errors(validator: Draft7Validator, instance: Any, where: str) -> Iterator[str]:
    for error in validator.iter_errors(instance):
        for leaf in _branch(error):
            leaf = best_match([leaf])
            path = "/".join(str(p) for p in leaf.absolute_path)
            yield f"{where}/{path}: {leaf.message}"


def _panels(panels: list[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def dashboard_errors(data: Mapping[str, Any]) -> list[str]:
    """Every place ``data`` departs from Grafana's schema; [] when it is valid."""
    errors = list(_errors(_dashboard(), data, ""))
    for panel in _panels(list(data.get("panels", []))):
        kind = panel.get("type")
        if kind == "row" or not isinstance(kind, str):
            continue
        where = f"panel {panel.get('title')!r} ({kind})"
        try:
            options = _plugin(kind, "Options")
        except KeyError:
            errors.append(f"{where}: no schema for {kind} panels in {DATA}")
            continue
        if options is not None:
            errors.extend(
                _errors(options, panel.get("options", {}), f"{where} options")
            )
        custom = _plugin(kind, "FieldConfig")
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        if custom is not None and "custom" in defaults:
            errors.extend(_errors(custom, defaults["custom"], f"{where} custom"))
    return errors
