"""Pytest fixtures for the fake providers: one server per dialect for the whole session, reset
before each test. Use with ``pytest_plugins = ["tests.fakes.fixtures"]`` or a star import."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.anthropic_fake import FakeAnthropic
from tests.fakes.base import running
from tests.fakes.ollama_fake import FakeOllama
from tests.fakes.openai_fake import FakeOpenAI

__all__ = ["fake_anthropic", "fake_anthropic_server", "fake_ollama", "fake_ollama_server", "fake_openai",
           "fake_openai_server"]


@pytest.fixture(scope="session")
def fake_openai_server() -> Iterator[FakeOpenAI]:
    with running(FakeOpenAI(), "/v1") as fake:
        yield fake


@pytest.fixture(scope="session")
def fake_anthropic_server() -> Iterator[FakeAnthropic]:
    with running(FakeAnthropic()) as fake:
        yield fake


@pytest.fixture(scope="session")
def fake_ollama_server() -> Iterator[FakeOllama]:
    with running(FakeOllama()) as fake:
        yield fake


@pytest.fixture
def fake_openai(fake_openai_server: FakeOpenAI) -> FakeOpenAI:
    """base_url ends in /v1, as an OpenAI-style profile's does."""
    fake_openai_server.reset()
    return fake_openai_server


@pytest.fixture
def fake_anthropic(fake_anthropic_server: FakeAnthropic) -> FakeAnthropic:
    fake_anthropic_server.reset()
    return fake_anthropic_server


@pytest.fixture
def fake_ollama(fake_ollama_server: FakeOllama) -> FakeOllama:
    fake_ollama_server.reset()
    return fake_ollama_server
