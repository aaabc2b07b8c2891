from __future__ import annotations

import pytest

# fake providers; pg_cluster (private PostgreSQL); redis_server (private Redis); the browser and
# its demo server for the page tests
pytest_plugins = ["tests.fakes.fixtures", "tests.pg_support", "tests.redis_support",
                  "tests.browser_support"]


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"
