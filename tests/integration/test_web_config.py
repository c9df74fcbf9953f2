"""``--web-config-file`` over real sockets, on both servers servemon runs for
Prometheus: the exporter's ``/metrics`` and the load generator's live ``/metrics``.

Certificates are made at test time (:mod:`tests.support.certs`); the client is
Python's ssl (through aiohttp) trusting the test CA.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import bcrypt
import pytest

from servemon.core.errors import ConfigError
from servemon.core.wire.webconfig import load_web_config
from servemon.loadgen.run.live import LiveMetrics
from servemon.monitor.config import ExporterConfig, TargetConfig
from servemon.monitor.exporter import Exporter
from servemon.monitor.fakegpu import FakeGpuReader
from tests.support.certs import Pki, make_pki

pytestmark = pytest.mark.integration

PASSWORD = "scrape-pw-7f3a-SECRET"
#: A target nothing listens on: the exporter still answers (target_up 0).
DEAD_TARGET = "http://127.0.0.1:9"

Server = Callable[[Path], contextlib.AbstractAsyncContextManager[str]]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def web_file(
    tmp_path: Path, pki: Pki, *, users: bool = True, client_auth: str | None = None
) -> Path:
    text = (
        "tls_server_config:\n"
        f"  cert_file: {pki.server_cert}\n"
        f"  key_file: {pki.server_key}\n"
    )
    if client_auth is not None:
        text += f"  client_auth_type: {client_auth}\n  client_ca_file: {pki.ca}\n"
    text += "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n"
    if users:
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
        text += f"basic_auth_users:\n  prometheus: {hashed}\n"
    path = tmp_path / "web.yml"
    path.write_text(text)
    return path


@contextlib.asynccontextmanager
async def exporter_server(path: Path) -> AsyncIterator[str]:
    config = ExporterConfig(
        targets=(TargetConfig(url=DEAD_TARGET, name="dead"),),
        listen="127.0.0.1:0",
        scrape_timeout=0.5,
        web_config_file=str(path),
    )
    async with Exporter(config, gpu_reader=FakeGpuReader()) as exp:
        yield f"{exp.url}/metrics"


@contextlib.asynccontextmanager
async def live_server(path: Path) -> AsyncIterator[str]:
    live = LiveMetrics("t", "m")
    try:
        yield await live.serve("127.0.0.1", 0, web_config=load_web_config(path))
    finally:
        await live.stop()


SERVERS = pytest.mark.parametrize(
    "server", [exporter_server, live_server], ids=["exporter", "live"]
)


def client_context(
    pki: Pki, cert: Path | None = None, key: Path | None = None
) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


def basic(user: str, password: str) -> dict[str, str]:
    pair = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {pair}"}


async def get(
    url: str, context: ssl.SSLContext | bool, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, ssl=context, headers=headers or {}) as resp,
    ):
        return resp.status, dict(resp.headers), await resp.text()


@pytest.mark.asyncio
@SERVERS
async def test_tls_and_basic_auth(server: Server, tmp_path: Path, pki: Pki) -> None:
    async with server(web_file(tmp_path, pki)) as url:
        assert url.startswith("https://127.0.0.1:")
        context = client_context(pki)
        status, headers, body = await get(url, context, basic("prometheus", PASSWORD))
        assert status == 200
        assert "servemon_" in body
        assert headers["X-Content-Type-Options"] == "nosniff"

        bodies = []
        for creds in (
            None,
            basic("prometheus", "wrong"),
            basic("mallory", PASSWORD),
            {"Authorization": f"Bearer {PASSWORD}"},
        ):
            status, headers, body = await get(url, context, creds)
            assert status == 401, creds
            assert headers["WWW-Authenticate"].startswith("Basic")
            assert headers["X-Content-Type-Options"] == "nosniff"
            bodies.append(body)
        assert all(PASSWORD not in b for b in bodies)

        # Plain HTTP to the TLS port gets no answer.
        plain = url.replace("https://", "http://")
        with pytest.raises(aiohttp.ClientError):
            await get(plain, False, basic("prometheus", PASSWORD))
        # A client that does not trust the server's CA refuses it.
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await get(url, ssl.create_default_context(), basic("prometheus", PASSWORD))


def handshake(url: str, context: ssl.SSLContext) -> bytes:
    """A TLS handshake with Python's ssl, then a request; the answer's first bytes
    (``b""``: the server closed the connection)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 443
    with (
        socket.create_connection((host, port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        tls.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return tls.recv(64)


@pytest.mark.asyncio
@SERVERS
async def test_client_certificates_required(
    server: Server, tmp_path: Path, pki: Pki
) -> None:
    path = web_file(
        tmp_path, pki, users=False, client_auth="RequireAndVerifyClientCert"
    )
    async with server(path) as url:
        trusted = client_context(pki, pki.client_cert, pki.client_key)
        answer = await asyncio.to_thread(handshake, url, trusted)
        assert answer.startswith(b"HTTP/1.1 200")
        status, _, body = await get(url, trusted)
        assert status == 200
        assert "servemon_" in body
        for context in (
            client_context(pki),  # no certificate
            client_context(pki, pki.stranger_cert, pki.stranger_key),  # another CA's
        ):
            # TLS 1.2: the server checks the client's certificate before its
            # Finished, so the handshake itself fails.
            context.maximum_version = ssl.TLSVersion.TLSv1_2
            with pytest.raises((ssl.SSLError, ConnectionError)):
                await asyncio.to_thread(handshake, url, context)
            # TLS 1.3: the client's handshake ends first; the server then drops the
            # connection without an answer.
            context.maximum_version = ssl.TLSVersion.TLSv1_3
            try:
                answer = await asyncio.to_thread(handshake, url, context)
            except (ssl.SSLError, ConnectionError):
                answer = b""
            assert answer == b""
            with pytest.raises(aiohttp.ClientError):
                await get(url, context)


@pytest.mark.asyncio
async def test_the_exporter_leaves_healthz_open_and_refuses_two_basic_auths(
    tmp_path: Path, pki: Pki
) -> None:
    async with exporter_server(web_file(tmp_path, pki)) as url:
        health = url.replace("/metrics", "/healthz")
        status, headers, _ = await get(health, client_context(pki))
        assert status == 200
        assert headers["X-Content-Type-Options"] == "nosniff"

    auth = tmp_path / "auth.yaml"
    auth.write_text("basic_auth:\n  username: a\n  password: b\n")
    config = ExporterConfig(
        targets=(TargetConfig(url=DEAD_TARGET),),
        auth_file=str(auth),
        web_config_file=str(web_file(tmp_path, pki)),
    )
    with pytest.raises(ConfigError, match="give one"):
        Exporter(config, gpu_reader=FakeGpuReader())


@pytest.mark.asyncio
async def test_the_auth_file_bearer_token_works_behind_tls(
    tmp_path: Path, pki: Pki
) -> None:
    token = "tok-1a2b3c-SECRET"
    auth = tmp_path / "auth.yaml"
    auth.write_text(f"bearer_token: {token}\n")
    config = ExporterConfig(
        targets=(TargetConfig(url=DEAD_TARGET),),
        listen="127.0.0.1:0",
        scrape_timeout=0.5,
        auth_file=str(auth),
        web_config_file=str(web_file(tmp_path, pki, users=False)),
    )
    async with Exporter(config, gpu_reader=FakeGpuReader()) as exp:
        url = f"{exp.url}/metrics"
        assert url.startswith("https://")
        context = client_context(pki)
        status, _, _ = await get(url, context)
        assert status == 401
        status, _, _ = await get(url, context, {"Authorization": f"Bearer {token}"})
        assert status == 200
