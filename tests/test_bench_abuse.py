"""The load bench's abuse mix (bench/loadkit/abuse.py) against a real server whose keepalive pings
come every 0.2 s: the flood must be answered ``rate_limited`` and stay connected through many pings
(it was closed with 1011 "keepalive ping timeout" when it never answered them), the oversized frame
must end in a readable 1009, and every outcome names its close code and reason."""

from __future__ import annotations

from typing import Any

import pytest

from bench.loadkit import abuse
from server.web.app import create_app
from server.web.ws_guard import LingeringWebSocketProtocol
from tests.support import run_server, settings_for

pytestmark = pytest.mark.anyio

PINGS = 5  # 5 pings of 0.2 s with a 0.3 s timeout: a client that never answers is gone after 0.5 s


def flooded_through_pings(outcomes: dict[str, dict[str, Any]]) -> bool:
    flood, oversized = outcomes["flood"], outcomes["oversized"]
    return bool(flood["pongs"] >= PINGS and flood["answers"]["rate_limited"] and oversized["closed"]) \
        or bool(flood["closed"])


async def test_bench_abuse_flood_is_rate_limited_and_outlives_keepalive_pings(tmp_path):
    app = create_app(settings_for(tmp_path))
    with run_server(app, ws=LingeringWebSocketProtocol, ws_max_size=16 << 20, ws_ping_interval=0.2,
                    ws_ping_timeout=0.3) as running:
        mix = await abuse.start(running.address, tokens=20)
        assert await mix.until(flooded_through_pings, timeout=30)
        outcomes = await mix.finish(linger=5)
    flood = outcomes["flood"]
    assert flood["closed"] == abuse.OPEN, flood
    assert flood["answers"]["rate_limited"] >= 1 and flood["sent"] > flood["answers"].total()
    assert outcomes["oversized"]["closed"].startswith("1009 "), outcomes["oversized"]
    # The non-reader answers no ping: the server's keepalive ends it (a bound too); it reads the
    # 1011 once it resumes reading at the end.
    assert outcomes["non_reader"]["closed"] == "1011 keepalive ping timeout", outcomes["non_reader"]
