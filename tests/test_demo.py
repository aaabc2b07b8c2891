"""The embedded default as a newcomer meets it: the README's examples work on it."""

from __future__ import annotations

import pytest

from server.config.load import settings_from_mapping
from tests.support import client, of_type, serve

pytestmark = pytest.mark.anyio


async def test_readme_hint_example_routes_one_turn_on_the_embedded_demo(tmp_path) -> None:
    settings = settings_from_mapping({"server": {"data_dir": str(tmp_path / "data")}}, env={})
    with serve(settings) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("/hint open what do you see?")
    route = of_type(frames, "route")[0]
    assert (route["model"], route["route_kind"], route["hint"]) == ("demo-open", "hint", "open")
    assert of_type(frames, "done")[0]["model"] == "demo-open"
