"""One line for what went wrong with a request: a server's error body (an OpenAI
error, FastAPI's ``detail``, a gateway's HTML page) and a TLS failure."""

from __future__ import annotations

import html
import json
import re
import ssl

import aiohttp

__all__ = ["error_message", "tls_failure"]

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
