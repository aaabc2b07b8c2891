"""The embedded default: with no provider configured, the offline ``demo`` provider.

A fresh start (no file, or a file with no ``[providers]``) chats at once on ``providers/demo.py``,
and the ``open`` hint routes to its second model, so the README's ``/hint open ...`` works too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from server.config.settings import ProviderProfile

DEMO_ROUTES = ({"hint": "open", "provider": "demo", "model": "demo-open"},)
DEMO_PROFILE = ProviderProfile(
    alias="demo", kind="demo", model="demo-small", context_window=4096, models={"demo-open": 0}
)


def providers_or_demo(providers: dict[str, ProviderProfile]) -> dict[str, ProviderProfile]:
    return providers or {"demo": DEMO_PROFILE}


def routes_or_demo(rows: list[dict[str, Any]],
                   providers: Mapping[str, ProviderProfile]) -> list[dict[str, Any]]:
    """The configured routes; none, on the embedded demo: its ``open`` hint's route."""
    if not rows and providers.get("demo") is DEMO_PROFILE:
        return [dict(row) for row in DEMO_ROUTES]
    return rows
