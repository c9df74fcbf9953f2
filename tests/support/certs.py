"""Test certificates, made at test time (no private key is ever committed).

:func:`make_pki` writes a CA, a server certificate for ``127.0.0.1`` and
``localhost`` signed by it, a client certificate signed by it, and a second,
unrelated CA's client certificate, all as PEM files in a directory.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Pki", "make_pki"]


@dataclass(frozen=True, slots=True)
class Pki:
    """Where :func:`make_pki` wrote each file."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    usage: x509.ObjectIdentifier | None = None,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer if issuer else (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        ).add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
            critical=False,
        )
    else:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
            critical=False,
        )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if sans:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(sans), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(cert: x509.Certificate, path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def make_pki(directory: Path) -> Pki:
    """Write a small PKI into ``directory``; return where each file is."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("servemon test CA", ca_key, None, ca=True)
    issuer = (ca.subject, ca_key)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _cert(
        "127.0.0.1",
        server_key,
        issuer,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        sans=[
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ],
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _cert(
        "prometheus", client_key, issuer, usage=ExtendedKeyUsageOID.CLIENT_AUTH
    )
    other_key = ec.generate_private_key(ec.SECP256R1())
    other_ca = _cert("another CA", other_key, None, ca=True)
    stranger_key = ec.generate_private_key(ec.SECP256R1())
    stranger = _cert(
        "stranger",
        stranger_key,
        (other_ca.subject, other_key),
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    pki = Pki(
        ca=directory / "ca.crt",
        server_cert=directory / "server.crt",
        server_key=directory / "server.key",
        client_cert=directory / "client.crt",
        client_key=directory / "client.key",
        stranger_cert=directory / "stranger.crt",
        stranger_key=directory / "stranger.key",
    )
    _pem(ca, pki.ca)
    _pem(server, pki.server_cert)
    _write_key(server_key, pki.server_key)
    _pem(client, pki.client_cert)
    _write_key(client_key, pki.client_key)
    _pem(stranger, pki.stranger_cert)
    _write_key(stranger_key, pki.stranger_key)
    return pki
