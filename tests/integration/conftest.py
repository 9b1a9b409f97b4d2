import uuid
from collections.abc import Iterator

import psycopg
import pytest


@pytest.fixture
def pg_url() -> Iterator[str]:
    name = f"t{uuid.uuid4().hex[:10]}"
    with psycopg.connect("postgresql://gpurm@127.0.0.1:55432/postgres", autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    yield f"postgresql://gpurm@127.0.0.1:55432/{name}"
