"""Accounts in the store: users, their sign-ins, their API tokens, and who owns a session.

What the store keeps (migration 7): a ``User`` (name unique whatever its case, optional email, role
``admin`` or ``user``, an argon2 password hash or none, created, disabled); a sign-in as the SHA-256
of its cookie's random id with its user and expiry; an API token as the SHA-256 of the secret shown
once, with ``last_used``; each session's ``owner_id`` (NULL: stored before accounts, or in the
``none`` and ``token`` modes, where nobody owns anything).

Revocation is a write: a password change or disabling a user deletes the user's sign-ins in the same
transaction, and every reader (``login_user``, ``live_logins``) also checks ``disabled``, so every
instance sharing the store sees the change on its next read.

``UserStore`` is the contract both backends implement; the SQL below is written once with ``?``
placeholders (``dialect_sql`` gives PostgreSQL its ``%s``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

ROLES = ("admin", "user")


@dataclass(frozen=True)
class User:
    id: str
    name: str
    email: str
    role: str
    password_hash: str | None
    created_at: str
    disabled: bool = False
    subject: str | None = None  # the OIDC provider's ``sub``, for an account that signs in there

    @property
    def admin(self) -> bool:
        return self.role == "admin"

    def public(self) -> dict[str, Any]:
        """What the API and the page may show: never the hash."""
        return {"id": self.id, "name": self.name, "email": self.email, "role": self.role,
                "created_at": self.created_at, "disabled": self.disabled}


@dataclass(frozen=True)
class ApiToken:
    id: str
    user_id: str
    name: str
    created_at: str
    last_used: str | None


@dataclass(frozen=True)
class UsageRow:
    """One user's month, for the admin listing: sessions, tokens spent and cost."""

    user: User
    sessions: int
    input_tokens: int
    output_tokens: int
    cost_usd: float


class UserStore(Protocol):
    async def create_user(self, user: User) -> None: ...  # UserExists when the name is taken
    async def get_user(self, user_id: str) -> User | None: ...
    async def find_user(self, name_or_email: str) -> User | None: ...  # any case
    async def subject_user(self, subject: str) -> User | None: ...
    async def set_role(self, user_id: str, role: str) -> None: ...
    async def list_users(self) -> list[User]: ...
    # both revoke every sign-in of the user in the same transaction
    async def set_password(self, user_id: str, password_hash: str) -> None: ...
    async def set_disabled(self, user_id: str, disabled: bool) -> None: ...
    async def delete_user(self, user_id: str) -> int: ...  # its sessions too; how many
    async def claim_orphans(self, user_id: str) -> int: ...  # ownerless sessions become the user's
    async def count_owned(self, user_id: str) -> int: ...
    async def session_owner(self, session_id: str) -> str | None: ...  # None: no session; "": unowned
    # keeps the user's newest MAX_LOGINS sign-ins
    async def create_login(self, key: str, user_id: str, expires_at: str) -> None: ...
    async def login_user(self, key: str, now: str) -> User | None: ...
    async def delete_login(self, key: str) -> None: ...
    async def prune_logins(self, now: str) -> int: ...  # expired sign-ins; how many
    async def live_logins(self, keys: list[str], now: str) -> set[str]: ...
    async def active_users(self, user_ids: list[str]) -> set[str]: ...
    async def live_tokens(self, token_hashes: list[str]) -> set[str]: ...  # not deleted, user enabled
    async def create_token(self, token: ApiToken, token_hash: str) -> None: ...
    # stamps last_used, to the minute (a script's every request is not a write)
    async def token_user(self, token_hash: str, now: str) -> User | None: ...
    async def list_tokens(self, user_id: str) -> list[ApiToken]: ...
    async def delete_token(self, user_id: str, token_id: str) -> bool: ...
    async def usage_since(self, since: str) -> list[UsageRow]: ...
    async def tokens_since(self, user_id: str, since: str) -> int: ...  # input + output, all sessions


USER_COLUMNS = "u.id, u.name, u.email, u.role, u.password_hash, u.created_at, u.disabled, u.subject"
INSERT_USER = ("INSERT INTO users (id, name, email, role, password_hash, created_at, disabled, subject) "
               "VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
USER_BY_ID = f"SELECT {USER_COLUMNS} FROM users u WHERE u.id = ?"
USER_BY_SUBJECT = f"SELECT {USER_COLUMNS} FROM users u WHERE u.subject = ?"
SET_ROLE = "UPDATE users SET role = ? WHERE id = ?"
USER_BY_NAME = (f"SELECT {USER_COLUMNS} FROM users u WHERE lower(u.name) = lower(?) "
                "OR (u.email <> '' AND lower(u.email) = lower(?)) ORDER BY lower(u.name) = lower(?) DESC")
ALL_USERS = f"SELECT {USER_COLUMNS} FROM users u ORDER BY u.created_at"
SET_PASSWORD = "UPDATE users SET password_hash = ? WHERE id = ?"
SET_DISABLED = "UPDATE users SET disabled = ? WHERE id = ?"
REVOKE_LOGINS = "DELETE FROM logins WHERE user_id = ?"
DELETE_OWNED = "DELETE FROM sessions WHERE owner_id = ?"
DELETE_USER = "DELETE FROM users WHERE id = ?"
CLAIM_ORPHANS = "UPDATE sessions SET owner_id = ? WHERE owner_id IS NULL"
COUNT_OWNED = "SELECT COUNT(*) FROM sessions WHERE owner_id = ?"
SESSION_OWNER = "SELECT COALESCE(owner_id, '') FROM sessions WHERE id = ?"
INSERT_LOGIN = "INSERT INTO logins (id, user_id, created_at, expires_at) VALUES (?, ?, ?, ?)"
MAX_LOGINS = 100  # sign-ins kept per user: the oldest goes when one more comes (a bound, not a policy)
TRIM_LOGINS = ("DELETE FROM logins WHERE user_id = ? AND id NOT IN "
               f"(SELECT id FROM logins WHERE user_id = ? ORDER BY created_at DESC LIMIT {MAX_LOGINS})")
LOGIN_USER = (f"SELECT {USER_COLUMNS} FROM logins l JOIN users u ON u.id = l.user_id "
              "WHERE l.id = ? AND l.expires_at > ? AND u.disabled = 0")
DELETE_LOGIN = "DELETE FROM logins WHERE id = ?"
PRUNE_LOGINS = "DELETE FROM logins WHERE expires_at <= ?"
INSERT_TOKEN = ("INSERT INTO api_tokens (id, user_id, name, token_hash, created_at, last_used) "
                "VALUES (?, ?, ?, ?, ?, NULL)")
TOKEN_USER = (f"SELECT {USER_COLUMNS}, t.last_used FROM api_tokens t JOIN users u ON u.id = t.user_id "
              "WHERE t.token_hash = ? AND u.disabled = 0")
STAMP_TOKEN = "UPDATE api_tokens SET last_used = ? WHERE token_hash = ?"
USER_TOKENS = ("SELECT id, user_id, name, created_at, last_used FROM api_tokens WHERE user_id = ? "
               "ORDER BY created_at")
DELETE_TOKEN = "DELETE FROM api_tokens WHERE user_id = ? AND id = ?"
# One row per user: sessions owned, and the calls of those sessions since ``since``.
USAGE = (f"SELECT {USER_COLUMNS}, (SELECT COUNT(*) FROM sessions s WHERE s.owner_id = u.id), "
         "COALESCE(SUM(c.input_tokens), 0), COALESCE(SUM(c.output_tokens), 0), COALESCE(SUM(c.cost_usd), 0) "
         "FROM users u LEFT JOIN sessions s2 ON s2.owner_id = u.id "
         "LEFT JOIN calls c ON c.session_id = s2.id AND c.created_at >= ? "
         "GROUP BY u.id, u.name, u.email, u.role, u.password_hash, u.created_at, u.disabled, u.subject "
         "ORDER BY u.created_at")


TOKENS_SINCE = ("SELECT COALESCE(SUM(c.input_tokens + c.output_tokens), 0) FROM calls c "
                "JOIN sessions s ON s.id = c.session_id WHERE s.owner_id = ? AND c.created_at >= ?")


def needs_stamp(last_used: str | None, now: str) -> bool:
    return last_used is None or last_used[:16] != now[:16]  # YYYY-MM-DDTHH:MM


def keys_in(sql: str, count: int) -> str:
    """``sql`` with its one ``(?*)`` replaced by ``count`` placeholders (at least one)."""
    return sql.replace("(?*)", "(" + ", ".join("?" * max(count, 1)) + ")")


LIVE_LOGINS = ("SELECT l.id FROM logins l JOIN users u ON u.id = l.user_id "
               "WHERE l.id IN (?*) AND l.expires_at > ? AND u.disabled = 0")
ACTIVE_USERS = "SELECT id FROM users WHERE id IN (?*) AND disabled = 0"
LIVE_TOKENS = ("SELECT t.token_hash FROM api_tokens t JOIN users u ON u.id = t.user_id "
               "WHERE t.token_hash IN (?*) AND u.disabled = 0")


def dialect_sql(sql: str) -> str:
    """The PostgreSQL spelling of one of the statements above (none holds a literal ``?``)."""
    return sql.replace("?", "%s")


def user_of(row: tuple[Any, ...]) -> User:
    return User(row[0], row[1], row[2], row[3], row[4], row[5], bool(row[6]), row[7])


def user_row(user: User) -> tuple[Any, ...]:
    return (user.id, user.name, user.email, user.role, user.password_hash, user.created_at,
            int(user.disabled), user.subject)


def usage_of(row: tuple[Any, ...]) -> UsageRow:
    return UsageRow(user_of(row[:8]), int(row[8]), int(row[9]), int(row[10]), float(row[11]))


def utc_now(after_seconds: float = 0.0) -> str:
    """Now (or ``after_seconds`` from now) as the store's ISO-8601 UTC text, which sorts as time."""
    return (datetime.now(UTC) + timedelta(seconds=after_seconds)).isoformat(timespec="microseconds")
