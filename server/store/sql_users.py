"""The ``server.store.users.UserStore`` contract over SQL, once for both backends: each method is a
statement of ``server.store.users`` run through the two primitives a backend gives, ``_read``
(rows) and ``_change`` (steps in one transaction), so SQLite and PostgreSQL differ only there."""

from __future__ import annotations

from typing import Any

from server.errors import UserExists
from server.store import users as sql
from server.store.users import ApiToken, UsageRow, User, usage_of, user_of, user_row, utc_now


class SqlUsers:
    duplicate: type[Exception]  # what the backend raises for a name or email already taken

    async def _read(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        raise NotImplementedError  # the backend's

    async def _change(self, *steps: tuple[str, tuple[Any, ...]]) -> int:
        """Run ``steps`` in one transaction; the rows the first one changed."""
        raise NotImplementedError  # the backend's

    async def create_user(self, user: User) -> None:
        try:
            await self._change((sql.INSERT_USER, user_row(user)))
        except self.duplicate as exc:
            raise UserExists(f"an account named {user.name!r} already exists") from exc

    async def get_user(self, user_id: str) -> User | None:
        rows = await self._read(sql.USER_BY_ID, user_id)
        return user_of(rows[0]) if rows else None

    async def find_user(self, name_or_email: str) -> User | None:
        rows = await self._read(sql.USER_BY_NAME, name_or_email, name_or_email, name_or_email)
        return user_of(rows[0]) if rows else None

    async def subject_user(self, subject: str) -> User | None:
        rows = await self._read(sql.USER_BY_SUBJECT, subject)
        return user_of(rows[0]) if rows else None

    async def set_role(self, user_id: str, role: str) -> None:
        await self._change((sql.SET_ROLE, (role, user_id)))

    async def list_users(self) -> list[User]:
        return [user_of(row) for row in await self._read(sql.ALL_USERS)]

    async def set_password(self, user_id: str, password_hash: str) -> None:
        await self._change((sql.SET_PASSWORD, (password_hash, user_id)), (sql.REVOKE_LOGINS, (user_id,)))

    async def set_disabled(self, user_id: str, disabled: bool) -> None:
        await self._change((sql.SET_DISABLED, (int(disabled), user_id)), (sql.REVOKE_LOGINS, (user_id,)))

    async def delete_user(self, user_id: str) -> int:
        return await self._change((sql.DELETE_OWNED, (user_id,)), (sql.DELETE_USER, (user_id,)))

    async def claim_orphans(self, user_id: str) -> int:
        return await self._change((sql.CLAIM_ORPHANS, (user_id,)))

    async def count_owned(self, user_id: str) -> int:
        return int((await self._read(sql.COUNT_OWNED, user_id))[0][0])

    async def session_owner(self, session_id: str) -> str | None:
        rows = await self._read(sql.SESSION_OWNER, session_id)
        return str(rows[0][0]) if rows else None

    async def create_login(self, key: str, user_id: str, expires_at: str) -> None:
        await self._change((sql.INSERT_LOGIN, (key, user_id, utc_now(), expires_at)),
                           (sql.TRIM_LOGINS, (user_id, user_id)))

    async def login_user(self, key: str, now: str) -> User | None:
        rows = await self._read(sql.LOGIN_USER, key, now)
        return user_of(rows[0]) if rows else None

    async def delete_login(self, key: str) -> None:
        await self._change((sql.DELETE_LOGIN, (key,)))

    async def prune_logins(self, now: str) -> int:
        return await self._change((sql.PRUNE_LOGINS, (now,)))

    async def live_logins(self, keys: list[str], now: str) -> set[str]:
        return {row[0] for row in await self._read(sql.keys_in(sql.LIVE_LOGINS, len(keys)), *keys, now)}

    async def active_users(self, user_ids: list[str]) -> set[str]:
        return {row[0] for row in await self._read(sql.keys_in(sql.ACTIVE_USERS, len(user_ids)), *user_ids)}

    async def live_tokens(self, token_hashes: list[str]) -> set[str]:
        statement = sql.keys_in(sql.LIVE_TOKENS, len(token_hashes))
        return {row[0] for row in await self._read(statement, *token_hashes)}

    async def create_token(self, token: ApiToken, token_hash: str) -> None:
        await self._change((sql.INSERT_TOKEN, (token.id, token.user_id, token.name, token_hash,
                                               token.created_at)))

    async def token_user(self, token_hash: str, now: str) -> User | None:
        rows = await self._read(sql.TOKEN_USER, token_hash)
        if not rows:
            return None
        if sql.needs_stamp(rows[0][8], now):
            await self._change((sql.STAMP_TOKEN, (now, token_hash)))
        return user_of(rows[0][:8])

    async def list_tokens(self, user_id: str) -> list[ApiToken]:
        return [ApiToken(*row) for row in await self._read(sql.USER_TOKENS, user_id)]

    async def delete_token(self, user_id: str, token_id: str) -> bool:
        return await self._change((sql.DELETE_TOKEN, (user_id, token_id))) > 0

    async def tokens_since(self, user_id: str, since: str) -> int:
        return int((await self._read(sql.TOKENS_SINCE, user_id, since))[0][0])

    async def usage_since(self, since: str) -> list[UsageRow]:
        return [usage_of(row) for row in await self._read(sql.USAGE, since)]
