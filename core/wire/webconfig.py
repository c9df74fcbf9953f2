"""The web config file: TLS and basic auth for the ``/metrics`` servers servemon runs.

``--web-config-file`` takes the file format of Prometheus' exporter-toolkit
(``tls_server_config``, ``http_server_config``, ``basic_auth_users``), so a file
written for node_exporter or Prometheus itself works here. :func:`load_web_config`
reads and checks it once, before anything is started: the certificate and key are
loaded, every password hash is checked to be bcrypt, and a field servemon does not
implement is refused by name (never silently ignored). Relative paths are read from
the file's own directory, as exporter-toolkit reads them.

Both the exporter (:mod:`servemon.monitor.exporter`) and the load generator's live
client metrics (:mod:`servemon.loadgen.run.live`) serve through :func:`web_middleware`
and :attr:`WebConfig.ssl_context`. Basic auth answers 401 with ``WWW-Authenticate:
Basic``; a verified (user, hash, password) is remembered, as exporter-toolkit does,
so bcrypt's cost is paid once per scraper and not on every scrape, and bcrypt runs
in a thread, one check at a time, so the event loop never waits on it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import re
import secrets
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import bcrypt
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from servemon.core.errors import ConfigError
from servemon.core.fields import FORBID_EXTRA, load, read_yaml

__all__ = [
    "BasicAuthenticator",
    "WebConfig",
    "load_web_config",
    "site_url",
    "web_middleware",
]

ClientAuthType = Literal[
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "RequireClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
]
TlsVersionName = Literal["TLS10", "TLS11", "TLS12", "TLS13"]

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}

#: The fields of each section servemon reads, and those exporter-toolkit has that
#: servemon refuses (with the reason), so that no setting is silently dropped.
KNOWN = {
    "": ("tls_server_config", "http_server_config", "basic_auth_users"),
    "tls_server_config": (
        "cert_file",
        "key_file",
        "client_auth_type",
        "client_ca_file",
        "min_version",
        "max_version",
        "prefer_server_cipher_suites",
    ),
    "http_server_config": ("http2", "headers"),
}
REFUSED = {
    "": {
        "rate_limit": "rate limiting is not implemented",
        "auth_excluded_paths": "every path but /healthz asks for credentials",
    },
    "tls_server_config": {
        "cert": "give the certificate as cert_file",
        "key": "give the key as key_file",
        "client_ca": "give the client CA as client_ca_file",
        "cipher_suites": "Go's cipher suite names are not implemented",
        "curve_preferences": "curve preferences are not implemented",
        "client_allowed_sans": "SAN matching is not implemented",
    },
}

#: The response headers http_server_config.headers may set, and the values allowed
#: where the header has a fixed set (as exporter-toolkit allows them).
RESPONSE_HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}

_BCRYPT = re.compile(r"^\$2[abxy]?\$(\d\d)\$[./A-Za-z0-9]{53}$")
#: Checked when the user is unknown, so that an unknown user costs as much time as a
#: wrong password (no user enumeration by timing); bcrypt of random bytes, cost 10.
_DECOY_HASH = b"$2b$10$1cNBgeBEwNZOGfS.OV9BueqnSPZnFt8JhUF.3WBCWtJ9uJU84Zsqy"
#: Verified credentials kept (exporter-toolkit keeps 100).
CACHE_SIZE = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class _TlsSection:
    __pydantic_config__ = FORBID_EXTRA

    cert_file: str | None = None
    key_file: str | None = None
    client_auth_type: ClientAuthType | None = None
    client_ca_file: str | None = None
    min_version: TlsVersionName = "TLS12"
    max_version: TlsVersionName = "TLS13"
    prefer_server_cipher_suites: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class _HttpSection:
    __pydantic_config__ = FORBID_EXTRA

    http2: bool = True
    headers: dict[str, str] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class _WebFile:
    __pydantic_config__ = FORBID_EXTRA

    tls_server_config: _TlsSection | None = None
    http_server_config: _HttpSection | None = None
    basic_auth_users: dict[str, str] | None = None


@dataclass(frozen=True, slots=True)
class WebConfig:
    """A web config file, checked: the TLS context (None: plain HTTP), the users
    and their bcrypt hashes (none: no basic auth), extra response headers."""

    source: str
    ssl_context: ssl.SSLContext | None = None
    users: Mapping[str, bytes] = field(default_factory=dict, repr=False)
    headers: Mapping[str, str] = field(default_factory=dict)
    #: Things worth one line in the server's log (a setting servemon applies more
    #: strictly than exporter-toolkit does).
    notes: tuple[str, ...] = ()

    @property
    def scheme(self) -> str:
        """``https`` with TLS, else ``http``."""
        return "http" if self.ssl_context is None else "https"


def load_web_config(path: Path) -> WebConfig:
    """Read and check a web config file; a bad one is a one-line ConfigError."""
    source = str(path)
    data = read_yaml(path)
    _check_keys(data, "", source)
    for section in ("tls_server_config", "http_server_config"):
        value = data.get(section)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {section}: expected a mapping")
        _check_keys(value, section, source)
    parsed = load(_WebFile, data, source)
    base = path.parent
    notes: list[str] = []
    context = (
        _ssl_context(parsed.tls_server_config, base, source, notes)
        if parsed.tls_server_config is not None
        else None
    )
    users = _users(parsed.basic_auth_users or {}, source)
    http = parsed.http_server_config
    headers = _headers(http.headers or {} if http else {}, source)
    return WebConfig(
        source=source,
        ssl_context=context,
        users=users,
        headers=headers,
        notes=tuple(notes),
    )


def _check_keys(data: Mapping[str, object], section: str, source: str) -> None:
    where = f"{section}." if section else ""
    for key in data:
        refused = REFUSED.get(section, {}).get(key)
        if refused is not None:
            raise ConfigError(
                f"{source}: {where}{key}: not supported by servemon ({refused})"
            )
        if key not in KNOWN[section]:
            known = ", ".join(KNOWN[section])
            raise ConfigError(f"{source}: {where}{key}: unknown field ({known})")


def _ssl_context(
    tls: _TlsSection, base: Path, source: str, notes: list[str]
) -> ssl.SSLContext | None:
    given = (tls.cert_file, tls.key_file, tls.client_auth_type, tls.client_ca_file)
    if all(v is None for v in given):
        return None  # as exporter-toolkit: no TLS setting given, plain HTTP
    where = f"{source}: tls_server_config"
    if not tls.cert_file:
        raise ConfigError(f"{where}.cert_file: required for TLS")
    if not tls.key_file:
        raise ConfigError(f"{where}.key_file: required for TLS")
    low, high = TLS_VERSIONS[tls.min_version], TLS_VERSIONS[tls.max_version]
    if low > high:
        raise ConfigError(
            f"{where}.min_version: {tls.min_version} is above max_version "
            f"{tls.max_version}"
        )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.minimum_version = low
        context.maximum_version = high
    except ValueError as exc:
        raise ConfigError(f"{where}.min_version: {exc}") from None
    cert = _path(tls.cert_file, base, f"{where}.cert_file")
    key = _path(tls.key_file, base, f"{where}.key_file")
    try:
        context.load_cert_chain(cert, key, password=_no_passphrase)
    except (ssl.SSLError, _PassphraseError) as exc:
        raise ConfigError(
            f"{where}.cert_file: {cert} with key_file {key}: cannot load "
            f"({_reason(exc)})"
        ) from None
    auth = tls.client_auth_type or "NoClientCert"
    if auth in ("NoClientCert", "RequestClientCert"):
        if tls.client_ca_file is not None:
            raise ConfigError(
                f"{where}.client_ca_file: given without a client_auth_type that "
                "checks client certificates (RequireAndVerifyClientCert)"
            )
        # RequestClientCert asks for a certificate and does nothing with it; Python's
        # ssl would refuse an unverifiable one, so it is not asked for at all.
        return context
    if tls.client_ca_file is None:
        raise ConfigError(
            f"{where}.client_ca_file: required with client_auth_type {auth} "
            "(Python's ssl verifies every client certificate it is given)"
        )
    ca = _path(tls.client_ca_file, base, f"{where}.client_ca_file")
    try:
        context.load_verify_locations(cafile=ca)
    except ssl.SSLError as exc:
        raise ConfigError(
            f"{where}.client_ca_file: {ca}: cannot load ({_reason(exc)})"
        ) from None
    if auth in ("RequireAnyClientCert", "RequireClientCert"):
        notes.append(
            f"client_auth_type {auth}: client certificates are verified against "
            "client_ca_file, as with RequireAndVerifyClientCert (Python's ssl "
            "cannot accept an unverified one)"
        )
    optional = auth == "VerifyClientCertIfGiven"
    context.verify_mode = ssl.CERT_OPTIONAL if optional else ssl.CERT_REQUIRED
    return context


class _PassphraseError(Exception):
    pass


def _no_passphrase() -> str:
    raise _PassphraseError("the key has a passphrase, which is not supported")


def _reason(exc: Exception) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    return str(exc) or type(exc).__name__


def _path(value: str, base: Path, where: str) -> Path:
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = base / path
    if not path.is_file():
        raise ConfigError(f"{where}: {path}: no such file")
    return path


def _users(users: Mapping[str, str], source: str) -> dict[str, bytes]:
    checked: dict[str, bytes] = {}
    for name, hashed in users.items():
        match = _BCRYPT.match(hashed)
        if not name or match is None or not 4 <= int(match.group(1)) <= 31:
            # The hash itself is not shown: it is as good as a password offline.
            raise ConfigError(
                f"{source}: basic_auth_users.{name}: expected a bcrypt hash "
                "($2y$10$..., e.g. from htpasswd -nBC 10 '' | tr -d ':\\n')"
            )
        checked[name] = hashed.encode()
    return checked


def _headers(headers: Mapping[str, str], source: str) -> dict[str, str]:
    for name, value in headers.items():
        allowed = RESPONSE_HEADERS.get(name)
        where = f"{source}: http_server_config.headers.{name}"
        if allowed is None:
            known = ", ".join(RESPONSE_HEADERS)
            raise ConfigError(f"{where}: cannot be configured (only {known})")
        if allowed and value not in allowed:
            raise ConfigError(
                f"{where}: expected one of {', '.join(allowed)} (got {value!r})"
            )
    return {name: value for name, value in headers.items() if value}


class BasicAuthenticator:
    """Checks ``Authorization: Basic`` against bcrypt hashes; remembers results.

    The key of a remembered result is a SHA-256 of (user, hash, password), never the
    password itself; at most :data:`CACHE_SIZE` are kept (then a tenth, chosen at
    random, make room), and failures are remembered too, so a scraper retrying a
    wrong password costs nothing. bcrypt runs in a thread, one check at a time.
    """

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self._users = dict(users)
        self._cache: dict[bytes, bool] = {}
        self._lock = asyncio.Lock()
        #: bcrypt checks made (not answered from the cache): tests read it.
        self.checks = 0

    async def check(self, authorization: str | None) -> bool:
        """Whether the ``Authorization`` header's credentials are a user's."""
        pair = _basic_credentials(authorization)
        if pair is None:
            return False
        user, password = pair
        known = self._users.get(user)
        hashed = known if known is not None else _DECOY_HASH
        key = hashlib.sha256(
            b"\0".join((user.encode(), hashed, hashlib.sha256(password).digest()))
        ).digest()
        ok = self._cache.get(key)
        if ok is None:
            async with self._lock:
                self.checks += 1
                ok = await asyncio.to_thread(_checkpw, password, hashed)
            self._remember(key, ok)
        return ok and known is not None

    def _remember(self, key: bytes, ok: bool) -> None:
        if len(self._cache) >= CACHE_SIZE:
            for old in secrets.SystemRandom().sample(
                list(self._cache), max(1, len(self._cache) // 10)
            ):
                del self._cache[old]
        self._cache[key] = ok


def _checkpw(password: bytes, hashed: bytes) -> bool:
    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:  # over bcrypt's 72 bytes, or a hash it cannot read
        return False


def _basic_credentials(header: str | None) -> tuple[str, bytes] | None:
    """``Basic base64(user:password)`` → (user, password); None if malformed."""
    if not header:
        return None
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    if not sep:
        return None
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        return None


def web_middleware(
    config: WebConfig, *, open_paths: tuple[str, ...] = ()
) -> Middleware:
    """An aiohttp middleware: basic auth on every path but ``open_paths`` (when the
    file has users), and the file's response headers on every answer."""
    authenticator = BasicAuthenticator(config.users) if config.users else None
    headers = dict(config.headers)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if (
            authenticator is not None
            and request.path not in open_paths
            and not await authenticator.check(request.headers.get("Authorization"))
        ):
            response: web.StreamResponse = web.Response(
                status=401,
                text="unauthorized\n",
                headers={"WWW-Authenticate": 'Basic realm="servemon"'},
            )
        else:
            try:
                response = await handler(request)
            except web.HTTPException as exc:
                exc.headers.update(headers)
                raise
        response.headers.update(headers)
        return response

    return middleware


def site_url(address: Sequence[object], config: WebConfig | None) -> str:
    """``scheme://host:port`` of a bound address (an IPv6 host in brackets)."""
    host, port = str(address[0]), address[1]
    scheme = "http" if config is None else config.scheme
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}"
