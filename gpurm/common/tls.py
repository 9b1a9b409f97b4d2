"""Optional mutual TLS for every gRPC connection (RM, agents, AMs, CLI), shared by all of them.

A `tls:` section in rm.yaml or agent.yaml names three PEM files, all required together:

    tls: {ca: ca.pem, cert: rm.pem, key: rm-key.pem}

`ca` is the CA that signed every certificate in the cluster; `cert` / `key` are this process's own certificate
and private key, used both to serve (the server asks every client for a certificate signed by `ca`) and to dial
(the client checks the server's certificate against `ca` and the address it dials, so a server certificate must
name its host or IP in its subjectAltName). Without the section everything is plaintext, as before.

The CLI and the AM read the same three files from GPURM_TLS_CA / GPURM_TLS_CERT / GPURM_TLS_KEY.

Identity under mTLS is the certificate's common name (CN): a user's certificate has CN = the user name; an
agent's has CN = `node:<node_id>` (NODE_PREFIX), and the AM an agent starts presents its node's certificate.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from gpurm.common.fields import ConfigError, Reader

ENV_CA = "GPURM_TLS_CA"
ENV_CERT = "GPURM_TLS_CERT"
ENV_KEY = "GPURM_TLS_KEY"
ENV_VARS = {"ca": ENV_CA, "cert": ENV_CERT, "key": ENV_KEY}
NODE_PREFIX = "node:"   # CN of an agent's certificate: node:<node_id>
FIELDS = ("ca", "cert", "key")
_PEM_MARKERS = {"ca": (b"-----BEGIN CERTIFICATE-----",), "cert": (b"-----BEGIN CERTIFICATE-----",),
                "key": (b"-----BEGIN PRIVATE KEY-----", b"-----BEGIN RSA PRIVATE KEY-----",
                        b"-----BEGIN EC PRIVATE KEY-----", b"-----BEGIN ENCRYPTED PRIVATE KEY-----")}
_WHAT = {"ca": "a PEM CA certificate", "cert": "a PEM certificate", "key": "a PEM private key"}
_MAX_PEM = 1024 * 1024


@dataclass(frozen=True)
class TLSConfig:
    """The three files (absolute paths) and their contents, read and checked once at load time."""

    ca: Path
    cert: Path
    key: Path
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def env(self) -> dict[str, str]:
        """GPURM_TLS_* naming these files: what an AM container needs to dial with this identity."""
        return {ENV_CA: str(self.ca), ENV_CERT: str(self.cert), ENV_KEY: str(self.key)}


def _read_pem(field: str, path: Path, name: str) -> tuple[bytes, str]:
    """The file's bytes, or an error line naming the field and the file."""
    try:
        data = path.read_bytes()[:_MAX_PEM + 1]
    except OSError as exc:
        return b"", f"{name}: cannot read {path}: {exc.strerror or exc}"
    if len(data) > _MAX_PEM or not any(m in data for m in _PEM_MARKERS[field]):
        return b"", f"{name}: {path} is not {_WHAT[field]}"
    return data, ""


def load_tls(values: Mapping[str, str], *, base: Path | None = None, where: str = "tls",
             names: Mapping[str, str] | None = None) -> TLSConfig:
    """Check and read {ca, cert, key} (paths; relative ones are taken from `base`). Raises ConfigError naming
    every field (`where.field`, or `names[field]`) that is missing, unreadable or not PEM."""
    label = {f: (names or {}).get(f) or f"{where}.{f}" for f in FIELDS}
    given = {f: str(values.get(f) or "") for f in FIELDS}
    missing = [f for f in FIELDS if not given[f]]
    if missing:
        have = ", ".join(label[f] for f in FIELDS if given[f])
        raise ConfigError([f"{label[f]}: is required with {have} (ca, cert and key go together)"
                           for f in missing])
    problems: list[str] = []
    paths: dict[str, Path] = {}
    pems: dict[str, bytes] = {}
    for f in FIELDS:
        path = Path(given[f]).expanduser()
        if not path.is_absolute() and base is not None:
            path = base / path
        paths[f] = path.resolve()
        pems[f], problem = _read_pem(f, paths[f], label[f])
        if problem:
            problems.append(problem)
    if problems:
        raise ConfigError(problems)
    return TLSConfig(ca=paths["ca"], cert=paths["cert"], key=paths["key"], ca_pem=pems["ca"],
                     cert_pem=pems["cert"], key_pem=pems["key"])


def read_tls_section(r: Reader, key: str = "tls", base: Path | None = None) -> TLSConfig | None:
    """The optional `tls:` section of a config document (relative paths from `base`, the config file's folder);
    problems are recorded on `r`, and None is returned with them."""
    if r.raw(key) is None:
        return None
    before = len(r.problems.items)
    t = r.section(key)
    values = {f: t.text(f, "") for f in FIELDS}
    t.reject_unknown()
    if len(r.problems.items) > before:
        return None
    try:
        return load_tls(values, base=base, where=t.where)
    except ConfigError as exc:
        r.problems.items.extend(exc.problems)
        return None


def tls_from_env(environ: Mapping[str, str] | None = None) -> TLSConfig | None:
    """TLS from GPURM_TLS_CA / GPURM_TLS_CERT / GPURM_TLS_KEY (CLI, AM); None when none is set. ConfigError
    when only some are set or a file is bad."""
    env = os.environ if environ is None else environ
    values = {f: env.get(var, "") for f, var in ENV_VARS.items()}
    if not any(values.values()):
        return None
    return load_tls(values, names=ENV_VARS)


# ---------------------------------------------------------------- credentials and channels


def server_credentials(tls: TLSConfig) -> grpc.ServerCredentials:
    """Serve with this certificate; every client must present one signed by the CA."""
    return grpc.ssl_server_credentials([(tls.key_pem, tls.cert_pem)], root_certificates=tls.ca_pem,
                                       require_client_auth=True)


def server_ssl_context(tls: TLSConfig) -> ssl.SSLContext:
    """The same material for HTTPS (the RM's web UI and REST API): serve with this certificate and require a
    client certificate signed by the CA, as gRPC does."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=tls.ca_pem.decode())
    ctx.load_cert_chain(tls.cert, tls.key)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def certificate_name(peercert: Any) -> str | None:
    """The CN of a verified peer certificate as Python's ssl module gives it (`getpeercert()`), or None."""
    if not isinstance(peercert, dict):
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and isinstance(value, str):
                return value
    return None


def channel_credentials(tls: TLSConfig) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=tls.ca_pem, private_key=tls.key_pem,
                                        certificate_chain=tls.cert_pem)


def add_port(server: grpc.Server | grpc.aio.Server, address: str, tls: TLSConfig | None) -> int:
    """Bind `address` (TLS when configured); the port bound, 0 when it could not be."""
    if tls is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, server_credentials(tls))


def aio_channel(address: str, tls: TLSConfig | None,
                options: Sequence[tuple[str, Any]] | None = None) -> grpc.aio.Channel:
    """An asyncio channel to `address`: mTLS with `tls`, else plaintext."""
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, channel_credentials(tls), options=options)


def channel(address: str, tls: TLSConfig | None,
            options: Sequence[tuple[str, Any]] | None = None) -> grpc.Channel:
    """A blocking channel to `address`: mTLS with `tls`, else plaintext."""
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, channel_credentials(tls), options=options)


# ---------------------------------------------------------------- identity


def peer_name(context: Any) -> str | None:
    """The CN of the client certificate of this call, or None on a plaintext connection (or none sent)."""
    try:
        auth = context.auth_context() or {}
    except Exception:
        return None
    names = auth.get("x509_common_name") or []
    if not names:
        return None
    name = names[0]
    return name.decode(errors="replace") if isinstance(name, bytes) else str(name)


def node_of(name: str | None) -> str | None:
    """The node id of an agent certificate's CN (`node:<node_id>`), None for any other name."""
    if name and name.startswith(NODE_PREFIX) and len(name) > len(NODE_PREFIX):
        return name[len(NODE_PREFIX):]
    return None
