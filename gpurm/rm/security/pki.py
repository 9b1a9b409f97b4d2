"""A small certificate authority for a cluster's mTLS (`gpurm admin pki`, `gpurm dev-cluster --tls`).

Names follow the identity rules (rm/security/identity.py): a user's certificate has CN = the user name, an agent's
`node:<node_id>`, the AM certificate an agent hands its AMs `am:<name>`, the RM's any name plus the hosts it is
dialled at (subjectAltName). Keys are ECDSA P-256, written 0600; certificates last `days` (default 365).
A production cluster may use its own CA instead: only the three PEM files of each `tls:` section matter.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT = "ca.pem"
CA_KEY = "ca-key.pem"


class PkiError(Exception):
    """A CA that cannot be read or made, or a name that cannot be certified."""


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path
    ca: Path

    def tls_section(self) -> dict[str, str]:
        """The `tls:` section (rm.yaml, agent.yaml) or `am_tls:` files for this certificate."""
        return {"ca": str(self.ca), "cert": str(self.cert), "key": str(self.key)}

    def env(self) -> dict[str, str]:
        """GPURM_TLS_* for the CLI."""
        return {"GPURM_TLS_CA": str(self.ca), "GPURM_TLS_CERT": str(self.cert), "GPURM_TLS_KEY": str(self.key)}


def _write(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def init_ca(directory: Path, name: str = "gpurm cluster CA", days: int = 3650) -> Path:
    """Make a CA in `directory` (ca.pem, ca-key.pem 0600); refuses to overwrite one."""
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    if cert_path.exists() or key_path.exists():
        raise PkiError(f"{directory} already holds a CA ({CA_CERT}); issue certificates with it, or pick "
                       "another directory")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .sign(key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    _write(key_path, _key_pem(key), 0o600)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert_path


def _load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        cert = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
        key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), password=None)
    except FileNotFoundError as exc:
        raise PkiError(f"no CA in {directory} ({exc.filename} missing): `gpurm admin pki init {directory}` "
                       "makes one") from None
    except (ValueError, TypeError) as exc:
        raise PkiError(f"the CA in {directory} cannot be read: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PkiError(f"{directory / CA_KEY}: expected an EC key")
    return cert, key


def _san(hosts: Sequence[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for h in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            out.append(x509.DNSName(h))
    return out


def issue(directory: Path, name: str, out: Path, hosts: Sequence[str] = (), days: int = 365,
          key_mode: int = 0o600) -> Issued:
    """A certificate with CN `name` (and `hosts` as subjectAltNames: a server's) signed by the CA in
    `directory`: `<out>.pem` and `<out>-key.pem` (mode `key_mode`)."""
    if not name or len(name) > 64 or any(ord(c) < 0x20 for c in name):
        raise PkiError(f"name: 1-64 printable characters, got {name!r}")
    ca_cert, ca_key = _load_ca(directory)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
               .issuer_name(ca_cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH,
                                                     ExtendedKeyUsageOID.SERVER_AUTH]), critical=False))
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName(_san(hosts)), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    cert_path = out.with_name(out.name + ".pem")
    key_path = out.with_name(out.name + "-key.pem")
    _write(key_path, _key_pem(key), key_mode)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return Issued(cert_path, key_path, directory / CA_CERT)
