"""Provider dialects behind one interface (``server.providers.base.Provider``).

``build_provider`` picks the dialect module by the profile's ``kind``.
"""

from __future__ import annotations

from server.config.settings import ProviderProfile
from server.providers.base import Provider


def build_provider(profile: ProviderProfile) -> Provider:
    if profile.kind == "demo":
        from server.providers.demo import DemoProvider

        return DemoProvider(profile)
    if profile.kind == "openai":
        from server.providers.openai import OpenAIProvider

        return OpenAIProvider(profile)
    if profile.kind == "anthropic":
        from server.providers.anthropic import AnthropicProvider

        return AnthropicProvider(profile)
    if profile.kind == "ollama":
        from server.providers.ollama import OllamaProvider

        return OllamaProvider(profile)
    raise ValueError(f"unknown provider kind {profile.kind!r}")
