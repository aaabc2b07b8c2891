"""Accounts in the store (server/store/users.py) and the directory over it (server/accounts/), on both
backends: names unique whatever their case, the first account an admin, ownerless sessions adopted by
the first admin, sign-ins revoked by a password change or disabling, owners filtering the list, API
tokens stamped when used, and the month's usage per user."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from server.accounts.directory import Directory
from server.accounts.passwords import verify
from server.accounts.usage import month_start
from server.errors import ClientError, UnknownUser, UserExists
from server.store.backends import open_store
from server.store.base import CallRecord, Store
from server.store.users import MAX_LOGINS, ApiToken, utc_now

pytestmark = pytest.mark.anyio
PASSWORD = "correct horse battery"


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    url = "" if request.param == "sqlite" else str(request.getfixturevalue("pg_cluster").new_database())
    opened = open_store(tmp_path / "data", url)
    yield opened
    await opened.close()


async def test_users_first_account_is_admin_and_names_are_unique_in_any_case(store: Store) -> None:
    directory = Directory(store)
    alice = await directory.add("Alice", PASSWORD, email="alice@example.com")
    bob = await directory.add("bob", PASSWORD)
    assert (alice.role, bob.role) == ("admin", "user")
    with pytest.raises(UserExists):
        await directory.add("ALICE", PASSWORD)
    assert (await store.find_user("alice")) == alice
    assert (await store.find_user("ALICE@example.com")) == alice
    assert [u.name for u in await store.list_users()] == ["Alice", "bob"]
    assert alice.password_hash is not None and PASSWORD not in alice.password_hash
    assert await verify(alice.password_hash, PASSWORD) and not await verify(alice.password_hash, "wrong pass")


async def test_users_bad_names_passwords_and_roles_are_refused(store: Store) -> None:
    directory = Directory(store)
    for name, password, role in (("two words", PASSWORD, ""), ("", PASSWORD, ""), ("carol", "short", ""),
                                 ("carol", PASSWORD, "root")):
        with pytest.raises(ClientError):
            await directory.add(name, password, role=role)
    with pytest.raises(UnknownUser):
        await directory.set_password("nobody", PASSWORD)
    assert await store.list_users() == []


async def test_users_ownerless_sessions_go_to_the_first_admin(store: Store) -> None:
    await store.create_session("old1", title="before accounts", route="demo")
    await store.create_session("old2", title="before accounts", route="demo")
    assert await store.session_owner("old1") == ""
    alice = await Directory(store).add("alice", PASSWORD)
    assert await store.session_owner("old1") == alice.id
    assert await store.session_owner("missing") is None
    assert [s.id for s in await store.list_sessions(owner=alice.id)] == ["old2", "old1"]


async def test_users_list_and_search_are_filtered_by_owner(store: Store) -> None:
    directory = Directory(store)
    alice, bob = await directory.add("alice", PASSWORD), await directory.add("bob", PASSWORD)
    await store.create_session("a", title="lighthouse notes", route="demo", owner=alice.id)
    await store.create_session("b", title="lighthouse too", route="demo", owner=bob.id)
    assert [s.id for s in await store.list_sessions("lighthouse", owner=bob.id)] == ["b"]
    assert {s.id for s in await store.list_sessions("lighthouse")} == {"a", "b"}  # no owner: no filter
    assert (await store.get_session("a")).owner == alice.id  # type: ignore[union-attr]


async def test_users_sign_ins_expire_and_are_revoked_by_password_and_disable(store: Store) -> None:
    directory = Directory(store)
    alice = await directory.add("alice", PASSWORD)
    await store.create_login("k1", alice.id, utc_now(3600))
    await store.create_login("k2", alice.id, utc_now(3600))
    await store.create_login("old", alice.id, utc_now(-1))
    assert (await store.login_user("k1", utc_now())) == alice
    assert await store.login_user("old", utc_now()) is None
    assert await store.prune_logins(utc_now()) == 1
    assert await store.live_logins(["k1", "k2", "nope"], utc_now()) == {"k1", "k2"}
    await store.delete_login("k1")
    assert await store.live_logins(["k1", "k2"], utc_now()) == {"k2"}
    await directory.set_password("alice", "a new password")
    assert await store.live_logins(["k2"], utc_now()) == set()
    await store.create_login("k3", alice.id, utc_now(3600))
    await directory.set_disabled("alice")
    assert await store.login_user("k3", utc_now()) is None and await store.active_users([alice.id]) == set()
    await directory.set_disabled("alice", False)
    assert await store.active_users([alice.id]) == {alice.id}


async def test_users_sign_ins_are_bounded_per_user(store: Store) -> None:
    alice = await Directory(store).add("alice", PASSWORD)
    keys = [f"k{n:03}" for n in range(MAX_LOGINS + 5)]
    for key in keys:
        await store.create_login(key, alice.id, utc_now(3600))
    assert await store.live_logins(keys, utc_now()) == set(keys[5:])  # the five oldest went


async def test_users_api_tokens_are_found_by_hash_and_stamped(store: Store) -> None:
    alice = await Directory(store).add("alice", PASSWORD)
    await store.create_token(ApiToken("t1", alice.id, "script", utc_now(), None), "hash-of-secret")
    assert (await store.list_tokens(alice.id))[0].last_used is None
    assert await store.token_user("hash-of-secret", "2026-12-02T00:00:00+00:00") == alice
    assert await store.token_user("other", utc_now()) is None
    assert (await store.list_tokens(alice.id))[0].last_used == "2026-12-02T00:00:00+00:00"
    await store.token_user("hash-of-secret", "2026-12-02T00:00:30+00:00")  # the same minute: no write
    assert (await store.list_tokens(alice.id))[0].last_used == "2026-12-02T00:00:00+00:00"
    await store.token_user("hash-of-secret", "2026-12-02T00:01:00+00:00")
    assert (await store.list_tokens(alice.id))[0].last_used == "2026-12-02T00:01:00+00:00"
    assert not await store.delete_token("someone-else", "t1")
    assert await store.delete_token(alice.id, "t1")
    assert await store.token_user("hash-of-secret", utc_now()) is None


async def test_users_remove_needs_consent_to_delete_sessions(store: Store) -> None:
    directory = Directory(store)
    await directory.add("alice", PASSWORD)
    bob = await directory.add("bob", PASSWORD)
    await store.create_session("b", title="t", route="demo", owner=bob.id)
    with pytest.raises(ClientError, match="--delete-sessions"):
        await directory.remove("bob", with_sessions=False)
    assert await directory.remove("bob", with_sessions=True) == 1
    assert await store.find_user("bob") is None and await store.session_owner("b") is None


async def test_users_usage_sums_this_month_per_user(store: Store) -> None:
    directory = Directory(store)
    alice, bob = await directory.add("alice", PASSWORD), await directory.add("bob", PASSWORD)
    await store.create_session("a", title="t", route="demo", owner=alice.id)
    await store.record_call("a", CallRecord("t1", "demo", "m", "default", 100, 20, "provider", 0.5))
    await store.record_call("a", CallRecord("t0", "demo", "m", "default", 7, 7, "provider", 9.0,
                                            created_at="2000-01-01T00:00:00+00:00"))  # an old month
    rows = {row.user.name: row for row in await store.usage_since(month_start())}
    assert (rows["alice"].sessions, rows["alice"].input_tokens, rows["alice"].output_tokens) == (1, 100, 20)
    assert rows["alice"].cost_usd == pytest.approx(0.5)
    assert (rows["bob"].sessions, rows["bob"].input_tokens, rows["bob"].cost_usd) == (0, 0, 0.0)
    assert bob.id == rows["bob"].user.id
