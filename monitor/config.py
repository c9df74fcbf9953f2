"""The exporter's configuration: targets, listening address, collectors, auth.

Every flag of ``servemon exporter`` is a field of the YAML config (``targets:`` is a
list of ``{url, name, engine, model}``); flags win. Credentials for ``/metrics`` come
from files (``auth_file``: a bearer token or a plain basic password;
``web_config_file``: TLS and bcrypt-hashed basic auth users), never from the command
line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from annotated_types import Ge, Gt, Le

from servemon.core.errors import ConfigError
from servemon.core.fields import FORBID_EXTRA, Secret, read_yaml

__all__ = [
    "Auth",
    "ExporterConfig",
    "TargetConfig",
    "load_auth",
    "parse_listen",
    "parse_target",
]

EngineName = Literal["vllm", "sglang", "tgi", "llamacpp"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetConfig:
    """One endpoint: its base URL, a name for the ``target`` label, an engine hint."""

    __pydantic_config__ = FORBID_EXTRA

    url: str
    name: str | None = None
    engine: EngineName | None = None
    model: str | None = None

    @property
    def label(self) -> str:
        """The ``target`` label: the name, else host:port of the URL."""
        return self.name or urlsplit(self.url).netloc or self.url


@dataclass(frozen=True, slots=True, kw_only=True)
class ExporterConfig:
    """Everything ``servemon exporter`` takes (see ``docs/exporter.md``)."""

    __pydantic_config__ = FORBID_EXTRA

    targets: tuple[TargetConfig, ...] = ()
    listen: str = "127.0.0.1:9400"
    scrape_timeout: Annotated[float, Gt(0)] = 2.5
    max_body_bytes: Annotated[int, Ge(1024)] = 8 * 1024 * 1024
    passthrough: bool = False
    gpu: bool = True
    gpu_interval: Annotated[float, Gt(0)] = 2.0
    probe_interval: Annotated[float, Gt(0)] | None = None
    probe_prompt: str = "Say hello."
    probe_max_tokens: Annotated[int, Ge(1), Le(4096)] = 8
    probe_timeout: Annotated[float, Gt(0)] = 30.0
    auth_file: str | None = None
    #: exporter-toolkit's web config file: TLS, basic auth users (bcrypt), response
    #: headers (:mod:`servemon.core.wire.webconfig`).
    web_config_file: str | None = None


def parse_target(text: str) -> TargetConfig:
    """``URL`` or ``NAME=URL`` from the command line."""
    name, sep, url = text.partition("=")
    if not sep or "://" in name:
        name, url = "", text
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--target {text!r}: expected [NAME=]http(s)://HOST:PORT")
    return TargetConfig(url=url.rstrip("/"), name=name or None)


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9400`` for IPv6)."""
    host, sep, port = text.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not sep or not host or not 0 <= number <= 65535:
        raise ConfigError(f"--listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9400")
    return host.strip("[]"), number


@dataclass(frozen=True, slots=True)
class Auth:
    """What ``/metrics`` asks of a scraper: a bearer token or basic credentials."""

    bearer_token: Secret | None = None
    username: str | None = None
    password: Secret | None = None


def load_auth(path: Path) -> Auth:
    """Read ``bearer_token: ...`` or ``basic_auth: {username, password}`` (YAML)."""
    data = read_yaml(path)
    token = data.get("bearer_token")
    basic = data.get("basic_auth")
    unknown = sorted(set(data) - {"bearer_token", "basic_auth"})
    if unknown:
        raise ConfigError(
            f"{path}: {unknown[0]}: unknown field (bearer_token, basic_auth)"
        )
    if (token is None) == (basic is None):
        raise ConfigError(f"{path}: give exactly one of bearer_token and basic_auth")
    if token is not None:
        if not isinstance(token, str) or not token:
            raise ConfigError(f"{path}: bearer_token: expected a non-empty string")
        return Auth(bearer_token=Secret(token))
    if not isinstance(basic, dict) or not all(
        isinstance(basic.get(k), str) and basic.get(k) for k in ("username", "password")
    ):
        raise ConfigError(f"{path}: basic_auth: expected username and password strings")
    return Auth(username=basic["username"], password=Secret(basic["password"]))
