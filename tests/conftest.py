from __future__ import annotations

import pytest

pytest_plugins = ["tests.fakes.fixtures", "tests.redis_support"]  # fake providers; redis_server


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"

