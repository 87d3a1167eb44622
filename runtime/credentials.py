"""A cluster's secrets: its token and, for multi-host use, its TLS material.

Every cluster has a fresh random token (every gRPC call and every page-protocol
connection proves it holds it). With ``Cluster(tls=True)`` the cluster also gets
its own certificate authority and one certificate signed by it, which every
server presents and every client checks (mutual TLS on gRPC and on the page
protocol). The certificate names no host: clients verify it against
:data:`TLS_SERVER_NAME`, so workers on any address share it.

Secrets reach a worker in one file (``clamor-worker --token-file F``): the bare
token, or a JSON object ``{"token": ..., "tls": {"ca": PEM, "cert": PEM, "key": PEM}}``.
Such files are always created mode 0600 with ``O_EXCL``; a file that other users
may read is refused.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import secrets
import stat
import tempfile

#: The name in the cluster certificate; clients check it instead of a host name.
TLS_SERVER_NAME = "clamor-cluster"


class InsecureTokenFile(PermissionError):
    """A token file that users other than its owner can read or write."""


def new_token() -> str:
    """A fresh cluster token: 32 random bytes, hex."""
    return secrets.token_hex(32)


@dataclasses.dataclass(frozen=True)
class TLSMaterial:
    """PEM-encoded CA certificate, cluster certificate and its private key."""

    ca: bytes
    cert: bytes
    key: bytes

    @classmethod
    def generate(cls, days: int = 30) -> TLSMaterial:
        """A new CA (never reused across clusters) and a certificate it signs."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        now = datetime.datetime.now(datetime.UTC)
        start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)

        def name(cn: str) -> x509.Name:
            return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(name("clamor cluster CA"))
            .issuer_name(name("clamor cluster CA"))
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(TLS_SERVER_NAME))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(TLS_SERVER_NAME)]), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        pem = serialization.Encoding.PEM
        return cls(
            ca=ca_cert.public_bytes(pem),
            cert=cert.public_bytes(pem),
            key=key.private_bytes(
                pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ),
        )

    def to_json(self) -> dict[str, str]:
        return {"ca": self.ca.decode(), "cert": self.cert.decode(), "key": self.key.decode()}

    @classmethod
    def from_json(cls, d: dict[str, str]) -> TLSMaterial:
        try:
            return cls(d["ca"].encode(), d["cert"].encode(), d["key"].encode())
        except (KeyError, AttributeError, TypeError) as exc:
            raise ValueError(f"malformed TLS section in a token file: {exc!r}") from None


@dataclasses.dataclass(frozen=True)
class Credentials:
    """What a cluster member needs: the token, and the TLS material when TLS is on."""

    token: str
    tls: TLSMaterial | None = None

    @classmethod
    def generate(cls, tls: bool = False) -> Credentials:
        return cls(new_token(), TLSMaterial.generate() if tls else None)

    def serialize(self) -> str:
        """The token file's text: the bare token without TLS, else JSON."""
        if self.tls is None:
            return self.token
        return json.dumps({"token": self.token, "tls": self.tls.to_json()})

    @classmethod
    def parse(cls, text: str) -> Credentials:
        text = text.strip()
        if not text:
            raise ValueError("empty token file")
        if not text.startswith("{"):
            return cls(text)
        try:
            d = json.loads(text)
            token = d["token"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"malformed token file: {exc!r}") from None
        if not isinstance(token, str) or not token:
            raise ValueError("malformed token file: no token")
        return cls(token, TLSMaterial.from_json(d["tls"]) if d.get("tls") else None)

    def write(self, path: str) -> None:
        """Write to a new file at ``path``, mode 0600 (fails if it exists)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.serialize())

    def write_temp(self, dir: str | None = None) -> str:
        """Write to a new 0600 temporary file; return its path (the caller removes it)."""
        fd, path = tempfile.mkstemp(prefix="clamor-token-", dir=dir)  # O_EXCL, 0600
        with os.fdopen(fd, "w") as f:
            f.write(self.serialize())
        return path

    @classmethod
    def read(cls, path: str) -> Credentials:
        """Read a token file; refuse one that other users may read or write."""
        with open(path) as f:
            mode = os.fstat(f.fileno()).st_mode
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise InsecureTokenFile(
                    f"token file {path} is accessible by other users (mode {mode & 0o777:o}); "
                    f"it must be private to its owner: chmod 600 {path}"
                )
            text = f.read()
        try:
            return cls.parse(text)
        except ValueError as exc:
            raise ValueError(f"token file {path}: {exc}") from None
