from __future__ import annotations

import pytest

pytest_plugins = ["tests.fakes.fixtures"]  # fake_openai, fake_anthropic, fake_ollama


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"

