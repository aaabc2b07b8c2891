"""The PostgreSQL store as a server uses it: chosen by ``[store] url``, start-up errors that name
the key (and never the password), a database that goes away and comes back, a whole server on it."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.config.load import settings_from_mapping
from server.errors import ConfigError, StoreUnavailable
from server.history.messages import ChatMessage
from server.store.backends import open_store
from server.store.postgres import PostgresStore
from server.store.sqlite import SqliteStore
from tests import pg_support
from tests.pg_support import PgCluster, PostgresMissing, free_port, running_cluster
from tests.support import SLOW_DEMO, client, serve, settings_for

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[PgCluster]:
    """A cluster this module may stop and start without disturbing the shared one."""
    with running_cluster() as cluster:
        yield cluster


async def test_store_url_chooses_the_backend(pg_cluster: PgCluster, tmp_path: Path) -> None:
    embedded = open_store(tmp_path / "a")
    shared = open_store(tmp_path / "b", pg_cluster.new_database())
    await embedded.close()
    await shared.close()
    assert isinstance(embedded, SqliteStore) and isinstance(shared, PostgresStore)
    assert not (tmp_path / "b").exists()  # the data folder is not used with PostgreSQL


def test_pg_support_without_the_binaries_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fixture turns this into a failure (pytest.fail), never a skip: CI must install them."""
    monkeypatch.setattr(pg_support.glob, "glob", lambda pattern: [])
    with pytest.raises(PostgresMissing, match="install Debian's `postgresql` package"):
        pg_support.find_bin_dir()


def test_store_url_setting_from_file_and_environment() -> None:
    file = settings_from_mapping({"store": {"url": "postgresql://a@h/db", "pool_size": 3}}, env={})
    assert (file.store.url, file.store.pool_size) == ("postgresql://a@h/db", 3)
    env = settings_from_mapping({}, env={"METERCHAT_STORE_URL": "postgresql://b@h/db"})
    assert env.store.url == "postgresql://b@h/db"
    default = settings_from_mapping({}, env={}).store
    assert (default.url, default.pool_size, default.timeout_seconds) == ("", 10, 10.0)  # SQLite by default


def test_store_url_of_another_engine_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="store.url: expected postgresql://"):
        open_store(tmp_path, "mysql://root@127.0.0.1/db")
    with pytest.raises(ConfigError, match="store.pool_size"):
        open_store(tmp_path, "postgresql://meterchat@127.0.0.1/db", 0)
    with pytest.raises(ConfigError, match="store.timeout_seconds"):
        open_store(tmp_path, "postgresql://meterchat@127.0.0.1/db", 1, 0)


def test_store_unreachable_database_stops_start_up_without_the_password(tmp_path: Path) -> None:
    url = f"postgresql://meterchat:s3cret@127.0.0.1:{free_port()}/meterchat"
    where = r"store.url: cannot open PostgreSQL 127.0.0.1:\d+/meterchat"
    with pytest.raises(ConfigError, match=where) as err:
        open_store(tmp_path, url)
    assert "s3cret" not in str(err.value)


async def test_store_lost_database_is_store_unavailable_then_recovers(own_cluster: PgCluster) -> None:
    store = PostgresStore.open(own_cluster.new_database(), timeout=1)
    await store.create_session("s", title="t", route="r")
    own_cluster.stop()
    try:
        with pytest.raises(StoreUnavailable, match="the session store cannot be reached"):
            await store.append_messages("s", [ChatMessage("user", "lost")])
    finally:
        own_cluster.start()
    # The pooled connection the restart closed is replaced when drawn. The pool reconnects with a
    # backoff that the outage grew, so on a loaded machine the first writes may still wait past
    # the 1 s timeout (seen once in a full run): each such wait is a clear StoreUnavailable, and a
    # write then goes through.
    for _ in range(30):
        try:
            await store.append_messages("s", [ChatMessage("user", "kept")])
            break
        except StoreUnavailable:
            continue
    session = await store.get_session("s")
    await store.close()
    assert session is not None
    assert [m.content for m in session.messages] == ["kept"]


async def test_store_first_use_during_an_outage_recovers(own_cluster: PgCluster) -> None:
    store = PostgresStore.open(own_cluster.new_database(), timeout=1)  # migrated, pool not yet open
    own_cluster.stop()
    try:
        with pytest.raises(StoreUnavailable):
            await store.create_session("s", title="t", route="r")
    finally:
        own_cluster.start()
    # The pool reconnects in the background; on a loaded machine that can outlast one 1 s wait, and
    # each wait meanwhile is a clear StoreUnavailable, never a pool closed for good.
    for _ in range(30):
        try:
            await store.create_session("s", title="t", route="r")
            break
        except StoreUnavailable:
            continue
    summary = await store.get_summary("s")
    await store.close()
    assert summary is not None


def test_store_url_that_does_not_parse_is_refused_without_echo(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="store.url: not a valid PostgreSQL URL") as err:
        open_store(tmp_path, "postgresql://meterchat:s3cret@127.0.0.1:99999999999/db?bogus_option=1")
    assert "s3cret" not in str(err.value)


async def test_store_a_server_on_postgresql_keeps_sessions_across_restarts(pg_cluster: PgCluster) -> None:
    url = pg_cluster.new_database()
    with tempfile.TemporaryDirectory() as folder:
        settings = settings_for(Path(folder), {"store": {"url": url}})
        with serve(settings) as address:
            async with client(address) as ws:
                await ws.hello()
                frames = await ws.say("hello there")
                session_id = ws.session_id
        assert frames[-1]["type"] == "done"
        assert not (Path(folder) / "data").exists()  # nothing went to the SQLite folder
        with serve(settings) as address:
            async with client(address) as ws:
                history = await ws.hello(session_id)
    contents = [m["content"] for m in next(f for f in history if f["type"] == "history")["messages"]]
    assert contents[0] == "hello there" and len(contents) == 2


async def test_store_lost_mid_reply_ends_the_turn_with_an_error(own_cluster: PgCluster) -> None:
    """Never a silent hang: the turn's own store writes fail, and the clients are still told."""
    url = own_cluster.new_database()
    with tempfile.TemporaryDirectory() as folder:
        store = {"url": url, "timeout_seconds": 0.5}
        settings = settings_for(Path(folder), {"store": store, "providers": {"demo": SLOW_DEMO}})
        with serve(settings) as address:
            async with client(address) as ws:
                await ws.hello()
                await ws.start_turn("a long story " * 20)
                own_cluster.stop()
                try:
                    frames = await ws.until("done", "error", timeout=30)
                finally:
                    own_cluster.start()
                assert (frames[-1]["type"], frames[-1]["code"]) == ("error", "store_unavailable")
                assert frames[-1]["retryable"] and frames[-1]["turn_id"]
                # The pool reconnects in the background (seconds on a loaded machine): until it has,
                # a message is refused as retryable store_unavailable, never lost or left hanging.
                for attempt in range(40):
                    again = await ws.say("are you back?", id=f"back-{attempt}")
                    if again[-1]["type"] == "done":
                        break
                    assert (again[-1]["type"], again[-1]["code"]) == ("error", "store_unavailable")
    assert again[-1]["type"] == "done"
