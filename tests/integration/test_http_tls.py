"""With mTLS the RM's HTTP server speaks HTTPS with the cluster CA, demands a client certificate and takes the
caller from it alone (no header, no cookie), as gRPC does."""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from gpurm.cli.client import current_user
from gpurm.rm.security import pki
from tests.conftest import TestBroker
from tests.integration.harness import DevCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, broker: TestBroker) -> Iterator[DevCluster]:
    c = DevCluster(tmp_path_factory.mktemp("http-tls"), nodes=1, gpus_per_node=2, racks=1, broker=broker,
                   extra=["--tls"])
    yield c
    assert c.stop() == 0


def context(c: DevCluster, who: str | None) -> ssl.SSLContext:
    """A client context trusting the cluster CA, with `who`'s certificate (`user`, a node's, or a new one)."""
    base = c.state_dir / "pki"
    ctx = ssl.create_default_context(cafile=str(base / "ca" / "ca.pem"))
    if who == "user":
        ctx.load_cert_chain(base / "user.pem", base / "user-key.pem")
    elif who is not None:
        issued = pki.issue(base / "ca", who, base / who.replace(":", "-"), days=1)
        ctx.load_cert_chain(issued.cert, issued.key)
    return ctx


def call(c: DevCluster, ctx: ssl.SSLContext, method: str, path: str, body: Any = None,
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    where = urlsplit(c.http_url)
    conn = http.client.HTTPSConnection(where.hostname or "", where.port, context=ctx, timeout=10)
    try:
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=hdrs)
        resp = conn.getresponse()
        text = resp.read()
        return resp.status, json.loads(text) if "json" in resp.getheader("Content-Type", "") else text.decode()
    finally:
        conn.close()


def test_https_with_the_cluster_ca_and_identity_from_the_certificate(cluster: DevCluster) -> None:
    assert cluster.http_url.startswith("https://127.0.0.1:")
    me = context(cluster, "user")
    status, body = call(cluster, me, "GET", "/api/v1/cluster", headers={"X-Gpurm-User": "mallory"})
    assert status == 200 and body["rm"]["insecure"] is False
    assert body["rm"]["caller"].startswith(f"user {current_user()} (certificate")       # the header is ignored
    status, page = call(cluster, me, "GET", "/", headers={"Cookie": "gpurm_user=mallory"})
    assert status == 200 and f"you are user {current_user()} (certificate" in page and "view as" not in page


def test_other_certificates_get_what_grpc_gives_them(cluster: DevCluster) -> None:
    me = context(cluster, "user")
    status, body = call(cluster, me, "POST", "/api/v1/jobs", {"gpus": 1, "command": "sleep 30",
                                                              "env": {"TOKEN": "t0p"}})
    assert status == 201, body
    job_id = body["job_id"]
    bob = context(cluster, "bob")
    status, job = call(cluster, bob, "GET", f"/api/v1/jobs/{job_id}")
    assert status == 200 and job["spec"]["env"] == {"TOKEN": "(hidden)"}
    status, body = call(cluster, bob, "POST", f"/api/v1/jobs/{job_id}/kill", {})
    assert status == 403 and f"bob may not kill {job_id}" in body["error"]["message"]
    node = context(cluster, "node:node-1")
    status, body = call(cluster, node, "POST", "/api/v1/jobs", {"gpus": 1, "command": "true"})
    assert status == 403 and "cannot act as a user" in body["error"]["message"]
    status, body = call(cluster, me, "POST", f"/api/v1/jobs/{job_id}/kill", {})
    assert status == 200 and body["job"]["state"] == "KILLED"


def test_no_client_certificate_no_answer(cluster: DevCluster) -> None:
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
        call(cluster, context(cluster, None), "GET", "/api/v1/cluster")
    where = urlsplit(cluster.http_url)
    plain = http.client.HTTPConnection(where.hostname or "", where.port, timeout=5)
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        plain.request("GET", "/api/v1/cluster", headers={"X-Gpurm-User": "root"})
        plain.getresponse().read()
    plain.close()
    # Still serving.
    assert call(cluster, context(cluster, "user"), "GET", "/api/v1/nodes")[0] == 200


def test_a_certificate_from_another_ca_is_refused(cluster: DevCluster, tmp_path: Path) -> None:
    other = tmp_path / "other-ca"
    pki.init_ca(other, days=1)
    issued = pki.issue(other, current_user(), tmp_path / "me", days=1)
    ctx = ssl.create_default_context(cafile=str(cluster.state_dir / "pki" / "ca" / "ca.pem"))
    ctx.load_cert_chain(issued.cert, issued.key)
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
        call(cluster, ctx, "GET", "/api/v1/cluster")
