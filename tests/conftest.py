from __future__ import annotations

import pytest

pytest_plugins = ["tests.fakes.fixtures", "tests.pg_support"]  # fake providers; pg_cluster


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"

