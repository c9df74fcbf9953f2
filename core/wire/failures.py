"""How a request went wrong, said once for every HTTP client of servemon: the outcome
and one line for an exception that ended the exchange (:func:`ending`), a server's
error body (an OpenAI error, FastAPI's ``detail``, a gateway's HTML page) and a TLS
failure. The load generator and the canary probe both label a fault through
:func:`ending`, so a connect timeout is ``connect_error`` in both."""

from __future__ import annotations

import html
import json
import re
import ssl

import aiohttp

from servemon.core.outcomes import Outcome
from servemon.core.wire.http import NotAnswered
from servemon.core.wire.limits import ResponseTooLarge, head_refused, head_too_large

__all__ = ["ENDINGS", "ending", "error_message", "tls_failure"]

#: The exceptions :func:`ending` owns: every way the wire can end an exchange
#: (aiohttp raises a bare ``RuntimeError("Connection closed.")`` in some of its
#: paths where the connection went away under a read).
ENDINGS = (
    TimeoutError,
    aiohttp.ClientError,
    ConnectionError,
    RuntimeError,
    NotAnswered,
    ResponseTooLarge,
)


def ending(exc: BaseException, where: str = "") -> tuple[Outcome, str]:
    """The outcome and one line for an exception of :data:`ENDINGS` that ended an
    exchange; ``where`` says how far the answer had come (``after 3 chunks``).
    A deadline or a walk-away the caller set is the caller's to tell first: here a
    :class:`TimeoutError` is the connect's (``connect_error``) or a read's."""
    at = f" {where}" if where else ""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return Outcome.CONNECT_ERROR, f"connect timeout: {exc}"
    if isinstance(exc, TimeoutError):
        return Outcome.TIMEOUT, f"read timeout: {exc or type(exc).__name__}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return Outcome.CONNECT_ERROR, tls_failure(exc) or str(exc)
    if isinstance(exc, NotAnswered):
        what = (
            "the server closed a fresh connection before answering"
            if exc.fresh
            else f"every pooled connection was closed ({exc.resends} resends)"
        )
        return Outcome.CONNECT_ERROR, f"{what}: {exc}"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return Outcome.STREAM_ERROR, f"connection cut{at}: {exc}"
    if isinstance(exc, ResponseTooLarge):
        return Outcome.RESPONSE_TOO_LARGE, f"{exc}{at}"
    head = head_refused(exc)
    if head is not None:
        large = head_too_large(exc)
        return (Outcome.RESPONSE_TOO_LARGE if large else Outcome.STREAM_ERROR), head
    return Outcome.STREAM_ERROR, f"{type(exc).__name__}{at}: {exc}"


_TITLE = re.compile(rb"<title[^>]*>(.*?)</title", re.I | re.S)
_TAG = re.compile(r"<[^>]*>")


def _text_message(raw: bytes) -> str:
    """A body that is not JSON, on one line: an HTML page's title (a gateway's or a
    load balancer's error page), else the start of its text without tags."""
    head = raw[:4096]
    title = _TITLE.search(head)
    text = (title.group(1) if title else head).decode("utf-8", errors="replace")
    if title is None and text.lstrip().startswith("<"):
        text = _TAG.sub(" ", text)
    return " ".join(html.unescape(text).split())[:200]


def tls_failure(exc: aiohttp.ClientConnectorError) -> str | None:
    """One line for a TLS failure (None for any other connection error): an
    untrusted certificate says which host and why, and how to trust a private CA."""
    where = f"{exc.host}:{exc.port}"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        cert = exc.certificate_error
        why = getattr(cert, "verify_message", None) or cert
        return (
            f"TLS: the certificate of {where} is not trusted here ({why}); for a "
            "private CA, set SSL_CERT_FILE to its PEM file"
        )
    if isinstance(exc, aiohttp.ClientConnectorSSLError):
        cause = exc.os_error
        why = (
            getattr(cause, "reason", None) if isinstance(cause, ssl.SSLError) else None
        )
        return f"TLS handshake with {where} failed: {why or cause}"
    return None


def error_message(raw: bytes) -> str:
    """The message of an OpenAI error body, else the start of the body, on one
    line."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _text_message(raw)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])[:500]
        if isinstance(body.get("detail"), str):  # FastAPI's (Transformers Serve)
            return str(body["detail"])[:500]
        if isinstance(err, str):
            return err[:500]
    return str(body)[:200]
