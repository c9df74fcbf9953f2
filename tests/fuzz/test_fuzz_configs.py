"""Config files and workload files, any bytes: a valid config, or one line.

Every file servemon reads from a user goes through its loader here: the YAML
configs of ``servemon ramp``/``sweep``/... (:class:`LoadConfig`), the exporter
(:class:`ExporterConfig`) and the simulator (:class:`SimConfig`), the exporter's
auth file, and the workload files (``file:`` prompts, ``sessions:`` ShareGPT
conversations, ``trace:`` in JSONL and CSV). The bytes are drawn near each format
(YAML mappings of the config's own fields with drawn values, JSON lines of the
fields a workload reads, CSV rows) and then broken (cut at any byte, bytes that
are not UTF-8 put in, nesting deep enough to exhaust a recursive parser), or are
any bytes at all. Property: the loader returns, or raises
:class:`servemon.core.errors.ConfigError` whose message is one line; nothing else
escapes.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from servemon.core.errors import ConfigError
from servemon.core.fields import layer_config
from servemon.loadgen.run.config import LoadConfig
from servemon.loadgen.workloads.promptfile import read_conversations, read_entries
from servemon.loadgen.workloads.tracefile import read_trace
from servemon.monitor.config import ExporterConfig, load_auth
from servemon.simulator.config import SimConfig

pytestmark = pytest.mark.fuzz

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(["2:30,4:30", "ttft_p95<=0.5", "gamma:2", "0/4", "auto", "1e999"]),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


def _broken(draw: st.DrawFn, body: bytes) -> bytes:
    """``body`` as it is, cut at a drawn byte, or with a drawn byte put in."""
    kind = draw(st.integers(0, 3))
    at = draw(st.integers(0, len(body)))
    if kind == 1:
        return body[:at]
    if kind == 2:
        junk = draw(st.sampled_from([b"\xff", b"\xc3", b"\x00", b"\t", b"\r", b"'"]))
        return body[:at] + junk + body[at:]
    if kind == 3:
        return body[:at] + b"[" * 1200 + body[at:]
    return body


@st.composite
def yaml_of(draw: st.DrawFn, fields: list[str]) -> bytes:
    """A YAML mapping of some of ``fields`` (and a stranger), drawn values."""
    keys = st.sampled_from([*fields, "no_such_field"])
    mapping = draw(st.dictionaries(keys, values, max_size=4))
    try:
        text = yaml.safe_dump(mapping, allow_unicode=True)
    except (yaml.YAMLError, ValueError):
        text = ""
    return _broken(draw, text.encode("utf-8", errors="surrogatepass"))


def _fields(cls: type[Any]) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


any_bytes = st.binary(max_size=300)


def _loads(suffix: str, body: bytes, load: Callable[[Path], object]) -> None:
    """``load`` the bytes as a file named ``*suffix``: it returns or raises one
    line of ConfigError."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"input{suffix}"
        path.write_bytes(body)
        try:
            load(path)
        except ConfigError as exc:
            message = str(exc)
            assert message, "an empty ConfigError"
            assert "\n" not in message, message
            assert "\r" not in message, message


CONFIGS: dict[str, type[Any]] = {
    "load": LoadConfig,
    "exporter": ExporterConfig,
    "simulator": SimConfig,
}


@pytest.mark.parametrize("kind", CONFIGS)
@given(data=st.data())
# Not UTF-8: read_yaml caught OSError only, and UnicodeDecodeError escaped.
@example(data=None)
def test_a_config_file_is_valid_or_one_line(kind: str, data: Any) -> None:
    cls = CONFIGS[kind]
    if data is None:
        body = b"seed: \xff\n"
    else:
        body = data.draw(st.one_of(yaml_of(_fields(cls)), any_bytes))
    _loads(".yaml", body, lambda path: layer_config(cls, path, {}))


@given(body=st.one_of(yaml_of(["bearer_token", "basic_auth"]), any_bytes))
def test_an_auth_file_is_valid_or_one_line(body: bytes) -> None:
    _loads(".yaml", body, load_auth)


@st.composite
def jsonl_of(draw: st.DrawFn, fields: list[str]) -> bytes:
    """JSON lines of objects with some of ``fields`` (drawn values), or a JSON
    array of them; then maybe broken."""
    keys = st.sampled_from([*fields, "other"])
    items = draw(st.lists(st.dictionaries(keys, values, max_size=4), max_size=4))
    if draw(st.booleans()):
        text = json.dumps(items)
    else:
        text = "\n".join(json.dumps(item) for item in items)
    if draw(st.integers(0, 5)) == 0:
        text += "\n" + "9" * 5000  # past Python's 4,300-digit limit for int()
    return _broken(draw, text.encode())


PROMPT_FIELDS = ["prompt", "messages", "output_tokens", "max_tokens", "conversations"]
SESSION_FIELDS = ["conversations", "system"]
TRACE_FIELDS = [
    "timestamp",
    "input_length",
    "output_length",
    "hash_ids",
    "prompt_tokens",
    "output_tokens",
    "prompt",
    "messages",
    "session_id",
    "model",
]
turns = st.lists(
    st.fixed_dictionaries(
        {"from": st.sampled_from(["human", "gpt", "system", "x"]), "value": values}
    ),
    max_size=3,
)


@given(body=st.one_of(jsonl_of(PROMPT_FIELDS), any_bytes))
# A JSON array nested past the recursion limit: RecursionError escaped (the line
# by line path caught it, the whole-array path did not).
@example(body=b"[" * 1200)
# An integer of 5,000 digits: json raises a ValueError that is not a
# JSONDecodeError, and it escaped.
@example(body=b'{"prompt": "a", "output_tokens": ' + b"9" * 5000 + b"}")
def test_a_prompt_file_is_valid_or_one_line(body: bytes) -> None:
    _loads(".jsonl", body, read_entries)


@given(
    body=st.one_of(
        jsonl_of(SESSION_FIELDS),
        st.lists(st.fixed_dictionaries({"conversations": turns}), max_size=3).map(
            lambda items: "\n".join(json.dumps(i) for i in items).encode()
        ),
        any_bytes,
    )
)
def test_a_sessions_file_is_valid_or_one_line(body: bytes) -> None:
    _loads(".jsonl", body, read_conversations)


@st.composite
def trace_csv(draw: st.DrawFn) -> bytes:
    header = draw(
        st.sampled_from(
            [
                "timestamp,prompt_tokens,output_tokens",
                "timestamp,prompt_tokens,output_tokens,hash_ids,model",
                "timestamp,prompt_tokens",
            ]
        )
    )
    cell = st.one_of(
        st.integers(-5, 10**6).map(str),
        st.floats().map(repr),
        st.sampled_from(["", '"1,2"', '"', "nan", "x", "1e999", "\x00"]),
    )
    rows = draw(st.lists(st.lists(cell, max_size=6), max_size=5))
    text = header + "\n" + "\n".join(",".join(row) for row in rows)
    if draw(st.integers(0, 6)) == 0:
        text += '\n1,2,"' + "x" * 140_000  # past the csv module's field limit
    return _broken(draw, text.encode())


@given(body=st.one_of(jsonl_of(TRACE_FIELDS), any_bytes))
@example(body=b'{"timestamp": 0, "input_length": ' + b"9" * 5000 + b"}")
def test_a_jsonl_trace_is_valid_or_one_line(body: bytes) -> None:
    _loads(".jsonl", body, read_trace)


@given(body=st.one_of(trace_csv(), any_bytes))
# A field over the csv module's 128 KiB limit: csv.Error escaped.
@example(body=b'timestamp,prompt_tokens,output_tokens\n0,1,"' + b"x" * 140_000)
def test_a_csv_trace_is_valid_or_one_line(body: bytes) -> None:
    _loads(".csv", body, read_trace)
