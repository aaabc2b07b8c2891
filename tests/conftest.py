from __future__ import annotations

import pytest

# fake providers; pg_cluster (private PostgreSQL); redis_server (private Redis)
pytest_plugins = ["tests.fakes.fixtures", "tests.pg_support", "tests.redis_support"]


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"

