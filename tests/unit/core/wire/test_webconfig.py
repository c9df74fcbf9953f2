"""The web config file (exporter-toolkit's format): what is read, what is refused
by name, and basic auth checked with bcrypt, its results remembered."""

from __future__ import annotations

import asyncio
import base64
import ssl
from pathlib import Path

import bcrypt
import pytest

from servemon.core.errors import ConfigError
from servemon.core.wire import webconfig
from servemon.core.wire.webconfig import BasicAuthenticator, load_web_config
from tests.support.certs import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def hashed(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "web.yml"
    path.write_text(text)
    return path


def error_of(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_web_config(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    return message


def test_a_full_file_with_relative_paths(tmp_path: Path, pki: Pki) -> None:
    # Relative paths are read from the file's own directory.
    (tmp_path / "certs").mkdir()
    for src in (pki.server_cert, pki.server_key, pki.ca):
        (tmp_path / "certs" / src.name).write_bytes(src.read_bytes())
    path = write(
        tmp_path,
        "tls_server_config:\n"
        "  cert_file: certs/server.crt\n"
        "  key_file: certs/server.key\n"
        "  client_auth_type: RequireAndVerifyClientCert\n"
        "  client_ca_file: certs/ca.crt\n"
        "  min_version: TLS13\n"
        "http_server_config:\n"
        "  http2: false\n"
        "  headers:\n"
        "    X-Content-Type-Options: nosniff\n"
        "    X-Frame-Options: deny\n"
        f"basic_auth_users:\n  alice: {hashed('pw')}\n",
    )
    config = load_web_config(path)
    assert config.scheme == "https"
    assert config.ssl_context is not None
    assert config.ssl_context.verify_mode == ssl.CERT_REQUIRED
    assert config.ssl_context.minimum_version == ssl.TLSVersion.TLSv1_3
    assert set(config.users) == {"alice"}
    assert config.headers == {
        "X-Content-Type-Options": "nosniff",
        "X-Frame-Options": "deny",
    }
    assert "$2" not in repr(config)


def test_no_tls_fields_is_plain_http_and_an_empty_file_is_nothing(
    tmp_path: Path,
) -> None:
    config = load_web_config(
        write(tmp_path, f"basic_auth_users:\n  a: {hashed('x')}\n")
    )
    assert config.ssl_context is None
    assert config.scheme == "http"
    empty = load_web_config(write(tmp_path, "tls_server_config: {}\n"))
    assert empty.ssl_context is None
    assert not empty.users


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tls_config: {}\n", "tls_config: unknown field"),
        ("tls_server_config:\n  certfile: x\n", "tls_server_config.certfile: unknown"),
        ("http_server_config:\n  gzip: true\n", "http_server_config.gzip: unknown"),
        ("rate_limit: {interval: 1s, burst: 2}\n", "rate_limit: not supported"),
        ("auth_excluded_paths: [/x]\n", "auth_excluded_paths: not supported"),
        (
            "tls_server_config:\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
            "tls_server_config.cipher_suites: not supported",
        ),
        (
            "tls_server_config:\n  client_allowed_sans: [a]\n",
            "tls_server_config.client_allowed_sans: not supported",
        ),
        ("tls_server_config:\n  cert: PEM\n", "tls_server_config.cert: not supported"),
        ("tls_server_config: [1]\n", "tls_server_config: expected a mapping"),
        (
            "tls_server_config:\n  key_file: k.pem\n",
            "tls_server_config.cert_file: required",
        ),
        (
            "tls_server_config:\n  client_auth_type: Sometimes\n",
            "tls_server_config.client_auth_type",
        ),
        (
            "http_server_config:\n  headers:\n    Server: nginx\n",
            "headers.Server: cannot be configured",
        ),
        (
            "http_server_config:\n  headers:\n    X-Frame-Options: allow\n",
            "headers.X-Frame-Options: expected one of deny, sameorigin",
        ),
        (
            "basic_auth_users:\n  alice: plain-SECRET\n",
            "basic_auth_users.alice: expected a bcrypt",
        ),
        (
            "basic_auth_users:\n  alice: $2y$99$" + "a" * 53 + "\n",
            "basic_auth_users.alice: expected a bcrypt",
        ),
    ],
)
def test_bad_fields_are_one_line_naming_the_field(
    tmp_path: Path, text: str, expected: str
) -> None:
    message = error_of(write(tmp_path, text))
    assert expected in message
    assert "SECRET" not in message


def test_tls_files_are_checked_before_anything_starts(tmp_path: Path, pki: Pki) -> None:
    def tls(**fields: str) -> Path:
        body = "".join(f"  {k}: {v}\n" for k, v in fields.items())
        return write(tmp_path, f"tls_server_config:\n{body}")

    cert, key, ca = pki.server_cert, pki.server_key, pki.ca
    assert "no such file" in error_of(tls(cert_file="missing.crt", key_file=str(key)))
    assert "cannot load" in error_of(tls(cert_file=str(cert), key_file=str(ca)))
    assert "cannot load" in error_of(
        tls(cert_file=str(cert), key_file=str(pki.client_key))
    )
    message = error_of(
        tls(cert_file=str(cert), key_file=str(key), client_ca_file=str(ca))
    )
    assert "client_ca_file: given without a client_auth_type" in message
    message = error_of(
        tls(
            cert_file=str(cert),
            key_file=str(key),
            client_auth_type="RequireAndVerifyClientCert",
        )
    )
    assert "client_ca_file: required" in message
    message = error_of(
        tls(
            cert_file=str(cert),
            key_file=str(key),
            min_version="TLS13",
            max_version="TLS12",
        )
    )
    assert "min_version: TLS13 is above max_version TLS12" in message
    message = error_of(tls(cert_file=str(cert), key_file=str(key), min_version="SSL3"))
    assert "min_version" in message


@pytest.mark.parametrize(
    ("kind", "mode"),
    [
        ("NoClientCert", ssl.CERT_NONE),
        ("RequestClientCert", ssl.CERT_NONE),
        ("VerifyClientCertIfGiven", ssl.CERT_OPTIONAL),
        ("RequireAndVerifyClientCert", ssl.CERT_REQUIRED),
        ("RequireAnyClientCert", ssl.CERT_REQUIRED),
    ],
)
def test_client_auth_types(tmp_path: Path, pki: Pki, kind: str, mode: int) -> None:
    ca = f"  client_ca_file: {pki.ca}\n" if mode != ssl.CERT_NONE else ""
    path = write(
        tmp_path,
        f"tls_server_config:\n  cert_file: {pki.server_cert}\n"
        f"  key_file: {pki.server_key}\n  client_auth_type: {kind}\n{ca}",
    )
    config = load_web_config(path)
    assert config.ssl_context is not None
    assert config.ssl_context.verify_mode == mode
    # RequireAnyClientCert is applied more strictly than Go's: said once, in the log.
    assert bool(config.notes) == (kind == "RequireAnyClientCert")


def test_basic_auth_checks_and_remembers() -> None:
    async def main() -> None:
        auth = BasicAuthenticator({"alice": hashed("right-pw").encode()})
        assert await auth.check(basic("alice", "right-pw"))
        assert await auth.check(basic("alice", "right-pw"))
        assert await auth.check("basic " + basic("alice", "right-pw")[6:])
        assert auth.checks == 1  # bcrypt once; the scrapes after it are remembered
        assert not await auth.check(basic("alice", "wrong"))
        assert not await auth.check(basic("alice", "wrong"))
        assert auth.checks == 2  # a wrong password is remembered too
        # An unknown user is checked against a decoy hash (the same time as a wrong
        # password), and never passes, even with the decoy's password.
        assert not await auth.check(basic("mallory", "right-pw"))
        assert auth.checks == 3
        for malformed in (
            None,
            "",
            "Bearer right-pw",
            "Basic !!!",
            "Basic " + base64.b64encode(b"no-colon").decode(),
            "Basic " + base64.b64encode(b"\xff:right-pw").decode(),
        ):
            assert not await auth.check(malformed)
        # Over bcrypt's 72 bytes: refused, not an error.
        assert not await auth.check(basic("alice", "x" * 100))

    asyncio.run(main())


def test_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(webconfig, "CACHE_SIZE", 10)

    async def main() -> None:
        auth = BasicAuthenticator({"alice": hashed("pw").encode()})
        for i in range(30):
            assert not await auth.check(basic("alice", f"wrong-{i}"))
        assert len(auth._cache) <= 10

    asyncio.run(main())


def test_a_bad_file_is_one_line(tmp_path: Path) -> None:
    assert "cannot read" in error_of(tmp_path / "absent.yml")
    assert "expected a mapping at the top level" in error_of(write(tmp_path, "- a\n"))
    message = error_of(write(tmp_path, "basic_auth_users: [alice]\n"))
    assert "basic_auth_users" in message
