"""What operators ask of a running server: /readyz (the store and Redis answer), /metrics
(Prometheus text, off by default, behind the API's auth), /healthz (liveness, whatever the store)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from tests.pg_support import PgCluster, running_cluster
from tests.redis_support import RedisServer
from tests.support import SHORT_REPLY, SLOW_DEMO, client, serve, settings_for

pytestmark = pytest.mark.anyio


def sample(text: str, name: str, **labels: str) -> float:
    """One sample's value in Prometheus text (0 when the series was never written)."""
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    for line in text.splitlines():
        match = re.fullmatch(rf"{re.escape(name)}(?:\{{(.*)\}})? (\S+)", line)
        if match and ",".join(sorted((match.group(1) or "").split(","))) == wanted:
            return float(match.group(2))
    return 0.0


async def test_ops_metrics_are_off_by_default(tmp_path: Path):
    with serve(settings_for(tmp_path)) as address:
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            assert (await http.get("/metrics")).status_code == 404


async def test_ops_metrics_count_turns_tokens_first_events_and_sockets(tmp_path: Path):
    settings = settings_for(tmp_path, {"providers": {"demo": SLOW_DEMO}}, metrics=True)
    with serve(settings) as address:
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            async with client(address) as ws:
                await ws.hello()
                done = (await ws.say(SHORT_REPLY))[-1]
                await ws.start_turn("a long one to stop", message_id="q2")
                open_now = (await http.get("/metrics")).text
                await ws.send("stop")
                await ws.until("aborted")
            with anyio.fail_after(10):  # the server sees the close a moment after the client sends it
                while sample((response := await http.get("/metrics")).text, "meterchat_websockets_open"):
                    pass
    text = response.text
    assert response.headers["content-type"].startswith("text/plain")
    assert sample(open_now, "meterchat_websockets_open") == 1
    assert sample(open_now, "meterchat_turns_running") == 1
    assert sample(text, "meterchat_websockets_open") == 0
    assert sample(text, "meterchat_turns_running") == 0
    assert sample(text, "meterchat_turns_total", outcome="done") == 1
    assert sample(text, "meterchat_turns_total", outcome="aborted") == 1
    route = {"provider": "demo", "model": "demo-small"}
    assert done["type"] == "done" and done["output_tokens"] > 0
    assert sample(text, "meterchat_tokens_total", direction="in", **route) >= done["input_tokens"]
    assert sample(text, "meterchat_tokens_total", direction="out", **route) >= done["output_tokens"]
    assert sample(text, "meterchat_provider_first_event_seconds_count", **route) == 2


async def test_ops_metrics_count_errors_by_code_and_trims_by_reason(tmp_path: Path):
    unreachable = {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
    settings = settings_for(tmp_path, {"providers": {"demo": {**SLOW_DEMO, "delay_ms": 0},
                                                     "gone": unreachable}}, metrics=True)
    with serve(settings) as address:
        async with client(address) as ws:
            await ws.hello()
            trims = []
            titles = ("paper moon", "harbour letters", "seventh garden", "spark train", "chess in the rain")
            for title in titles + titles[:2]:  # long texts: demo-small's budget trims old turns
                frames = await ws.say(f"please look up {title}")
                trims += [frame for frame in frames if frame["type"] == "history_trimmed"]
            await ws.send("switch_model", route="gone")
            await ws.until("context")
            failed = (await ws.say("hello?"))[-1]
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            text = (await http.get("/metrics")).text
    assert failed["type"] == "error"
    assert sample(text, "meterchat_errors_total", code=failed["code"]) == 1
    assert sample(text, "meterchat_turns_total", outcome="error") == 1
    assert trims and sample(text, "meterchat_trims_total", reason="token_budget") == len(trims)


async def test_ops_metrics_need_the_token_like_the_api(tmp_path: Path):
    with serve(settings_for(tmp_path, metrics=True, auth_token="s3cret")) as address:
        async with httpx.AsyncClient(base_url=f"http://{address}") as http:
            refused = await http.get("/metrics")
            allowed = await http.get("/metrics", headers={"authorization": "Bearer s3cret"})
    assert refused.status_code == 401
    assert allowed.status_code == 200 and "meterchat_turns_running" in allowed.text


@pytest.fixture
def own_cluster() -> Iterator[PgCluster]:
    with running_cluster() as cluster:
        yield cluster


async def test_ops_readyz_fails_while_the_database_is_down_and_healthz_answers(
        own_cluster: PgCluster, tmp_path: Path):
    settings = settings_for(tmp_path, {"store": {"url": own_cluster.new_database(), "timeout_seconds": 1}})
    with serve(settings) as address:
        async with httpx.AsyncClient(base_url=f"http://{address}", timeout=10) as http:
            up = await http.get("/readyz")
            own_cluster.stop()
            try:
                down = await http.get("/readyz")
                alive = await http.get("/healthz")
            finally:
                own_cluster.start()
    assert up.status_code == 200 and up.json() == {"ready": True, "checks": {"store": "ok"}}
    assert down.status_code == 503 and down.json()["ready"] is False
    assert down.json()["checks"]["store"] != "ok"
    assert alive.status_code == 200


async def test_ops_readyz_fails_while_redis_is_down(fresh_redis: RedisServer, tmp_path: Path):
    settings = settings_for(tmp_path, {"live": {"url": fresh_redis.url}})
    with serve(settings) as address:
        async with httpx.AsyncClient(base_url=f"http://{address}", timeout=10) as http:
            up = await http.get("/readyz")
            fresh_redis.stop()
            down = await http.get("/readyz")
            alive = await http.get("/healthz")
    assert up.json() == {"ready": True, "checks": {"store": "ok", "live": "ok"}}
    assert down.status_code == 503 and down.json()["checks"]["store"] == "ok"
    assert "Redis" in down.json()["checks"]["live"]
    assert alive.status_code == 200
