"""What the coordinator and its workers say to each other, and the shared token.

One WebSocket per worker (aiohttp's, so TLS comes with the coordinator's
``--web-config-file``), binary frames of JSON (orjson). Each message is an object
whose ``k`` names its kind:

- worker → coordinator: ``hello`` (name, host, pid, its clock's frame), ``pong``
  (an answer to a ping, with the worker's monotonic time), ``rec`` (finished
  requests, as ``requests.jsonl`` lines on the worker's clock, batched), ``recs``
  (the records of sliced credits: a line of JSON, then the ``requests.jsonl``
  lines themselves, already in the coordinator's frame, :func:`recs_message`), ``ft``
  (first tokens, where the coordinator asked for them), ``bye`` (the worker's last
  word: what it sent and recorded).
- coordinator → worker: ``plan`` (the target URL, the request headers, the client's
  limits), ``ping`` (the clock, and the coordinator's heartbeat), ``go`` (credits:
  requests to send, each at a time on the worker's own clock), ``due`` (a slice
  of the schedule: credits as ``[id, stage, time, body, options]``, and the
  offset they were converted with, which their records come back moved by),
  ``cancel``
  (requests to give up), ``stop`` (no more sends; finish, then say ``bye``).

The token travels in the upgrade request's ``Authorization: Bearer`` header; the
coordinator compares it in constant time and refuses the upgrade without it.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from servemon.core.errors import ConfigError
from servemon.core.fields import Secret
from servemon.loadgen.record.line import Line

__all__ = [
    "MAX_MESSAGE",
    "PATH",
    "RECS",
    "TOKEN_ENV",
    "WireError",
    "bearer",
    "decode",
    "encode",
    "read_recs",
    "read_token",
    "recs_message",
    "token_matches",
]

#: The coordinator's WebSocket path.
PATH = "/fleet"
#: How a ``recs`` frame begins (:func:`recs_message`).
RECS = b'{"k":"recs"'
#: Where the shared token is read from when no ``--fleet-token-file`` is given.
TOKEN_ENV = "SERVEMON_FLEET_TOKEN"
#: The largest message either side reads (a batch of credits with long prompts):
#: a bigger one closes the connection, never the process's memory.
MAX_MESSAGE = 64 * 1024 * 1024


class WireError(Exception):
    """A message that is not one of ours."""


def encode(message: Mapping[str, Any]) -> bytes:
    """A message as the bytes of one frame."""
    return orjson.dumps(message)


def decode(data: bytes | str) -> Line:
    """One frame's message; :class:`WireError` for anything else."""
    try:
        message = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"not JSON: {exc}") from None
    if not isinstance(message, dict) or not isinstance(message.get("k"), str):
        raise WireError("not a message (an object with a kind 'k')")
    return message


def recs_message(count: int, lines: bytes) -> bytes:
    """A ``recs`` frame: its header (the kind, how many lines), a newline, then
    ``lines``, each a ``requests.jsonl`` line with its newline (a JSON line holds no
    raw newline, so the header ends at the first)."""
    return orjson.dumps({"k": "recs", "n": count}) + b"\n" + lines


def read_recs(data: bytes) -> tuple[bytes, list[Line]]:
    """A ``recs`` frame's lines, as they came and as objects (one parse for the
    batch); :class:`WireError` for anything else."""
    _head, _, lines = data.partition(b"\n")
    if not lines:
        return b"", []
    if not lines.endswith(b"\n"):
        raise WireError("a recs frame whose lines do not end in a newline")
    try:
        parsed = orjson.loads(b"[" + lines[:-1].replace(b"\n", b",") + b"]")
    except orjson.JSONDecodeError as exc:
        raise WireError(f"recs lines are not JSON: {exc}") from None
    if not all(isinstance(line, dict) for line in parsed):
        raise WireError("a recs line that is not an object")
    return lines, parsed


def read_token(token_file: str | None, env: Mapping[str, str] = os.environ) -> Secret:
    """The fleet's shared token: the file's first line, else ``$SERVEMON_FLEET_TOKEN``
    (never a flag's value: a command line is public). A one-line error naming where
    it looked when there is none, or it is too short to guess at."""
    if token_file is not None:
        try:
            text = Path(token_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                f"--fleet-token-file {token_file}: {exc.strerror or exc}"
            ) from None
        token = text.strip().splitlines()[0].strip() if text.strip() else ""
        where = f"--fleet-token-file {token_file}"
    else:
        token = env.get(TOKEN_ENV, "").strip()
        where = f"${TOKEN_ENV}"
    if not token:
        raise ConfigError(
            f"{where}: no fleet token (give --fleet-token-file FILE or set "
            f"{TOKEN_ENV}; every worker needs the same)"
        )
    if len(token) < 16:
        raise ConfigError(f"{where}: the fleet token is shorter than 16 characters")
    return Secret(token)


def bearer(token: Secret) -> dict[str, str]:
    """The upgrade request's header carrying ``token``."""
    return {"Authorization": f"Bearer {token.reveal()}"}


def token_matches(token: Secret, authorization: str | None) -> bool:
    """Whether an ``Authorization`` header carries ``token`` (constant time)."""
    if not authorization or not authorization.startswith("Bearer "):
        return False
    given = authorization.removeprefix("Bearer ").strip().encode()
    return hmac.compare_digest(given, token.reveal().encode())
