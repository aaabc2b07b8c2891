from __future__ import annotations

import pytest

# fake providers; the private PostgreSQL cluster; the browser and its server for the page tests
pytest_plugins = ["tests.fakes.fixtures", "tests.pg_support", "tests.browser_support"]


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"

