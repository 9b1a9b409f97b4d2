"""Every attack of issue 13 against a real dev cluster, without and with mTLS: each must be refused."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.security.attacks import ATTACKS, Cluster, dev_cluster, run_attack


@pytest.fixture(scope="module", params=[False, True], ids=["insecure", "mtls"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with dev_cluster(request.param, workdir=tmp_path_factory.mktemp("pentest")) as c:
        yield c


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_is_refused(cluster: Cluster, name: str) -> None:
    result = run_attack(name, cluster)
    assert result.ok, f"{name} got through: expected {result.expected}; observed {result.observed}"
