"""The session store: what it keeps and the interface every backend implements.

A session is a title, a route, an ordered transcript of ``ChatMessage`` (every mark and the turn id
kept) and the list of provider calls it made. ``Store`` is the contract the session code calls; the
embedded SQLite backend (``server.store_sqlite``) is the default; PostgreSQL (``server.store_postgres``)
is the server-grade one several instances can share, chosen by ``[store] url``. Both run the same
numbered schema migrations (``server.migrations``) when opened.

Contract of the write methods: when the awaited call returns, the write is committed (a crash after
that point loses nothing). ``append_messages`` adds after the last message; ``save_messages``
upserts by message id (content and marks of a known id are replaced, its position kept; an unknown
id is appended), which is how a streaming reply is flushed at intervals and how trims are recorded;
``insert_message`` places one message at an index (a breadcrumb or summary after the system
messages). Methods naming a session that is not stored raise ``UnknownSession``. Timestamps are
ISO-8601 UTC strings with microseconds, so they sort as text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from server.errors import ConfigError
from server.history import ChatMessage, Image, ToolCall, left_out_from, stored_marks


@dataclass(frozen=True)
class CallRecord:
    """One provider call: which route served it and what it cost (None = no price known)."""

    turn_id: str | None
    provider: str
    model: str
    route_kind: str
    input_tokens: int
    output_tokens: int
    tokens_source: str
    cost_usd: float | None = None
    created_at: str | None = None  # filled by the store when None


@dataclass(frozen=True)
class SessionSummary:
    id: str
    title: str
    route: str
    created_at: str
    updated_at: str
    message_count: int

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "route": self.route, "created_at": self.created_at,
                "updated_at": self.updated_at, "message_count": self.message_count}


@dataclass
class StoredSession:
    id: str
    title: str
    route: str
    created_at: str
    updated_at: str
    messages: list[ChatMessage] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)


class Store(Protocol):
    async def close(self) -> None: ...

    async def create_session(self, session_id: str, *, title: str, route: str) -> None: ...

    async def get_session(self, session_id: str) -> StoredSession | None: ...

    async def get_summary(self, session_id: str) -> SessionSummary | None: ...

    async def list_sessions(self) -> list[SessionSummary]: ...

    async def rename_session(self, session_id: str, title: str) -> None: ...

    async def set_route(self, session_id: str, route: str) -> None: ...

    async def delete_session(self, session_id: str) -> None: ...

    async def append_messages(self, session_id: str, messages: Sequence[ChatMessage]) -> None: ...

    async def save_messages(self, session_id: str, messages: Sequence[ChatMessage]) -> None: ...

    async def insert_message(self, session_id: str, index: int, message: ChatMessage) -> None: ...

    async def record_call(self, session_id: str, call: CallRecord) -> None: ...

    async def import_session(self, session: StoredSession) -> None: ...


def open_store(data_dir: str | Path, url: str = "", pool_size: int = 10, timeout: float = 10.0) -> Store:
    """The store ``[store] url`` names (PostgreSQL), else the embedded one: ``meterchat.sqlite3``
    under ``data_dir`` (both created if missing). Either is migrated to the current schema."""
    if not url:
        from server.store_sqlite import SqliteStore

        return SqliteStore.open(data_dir)
    if url.split("://", 1)[0] not in ("postgresql", "postgres"):
        raise ConfigError("store.url: expected postgresql://USER@HOST:PORT/DATABASE")
    if pool_size < 1:
        raise ConfigError(f"store.pool_size: expected at least 1, got {pool_size}")
    if timeout <= 0:
        raise ConfigError(f"store.timeout_seconds: expected more than 0, got {timeout}")
    from server.store_postgres import PostgresStore

    return PostgresStore.open(url, pool_size, timeout)


# Message <-> plain data: one codec shared by the SQLite rows and the JSON export.

def tool_calls_to_data(calls: Sequence[ToolCall] | None) -> list[dict[str, Any]] | None:
    if calls is None:
        return None
    return [{"id": call.id, "name": call.name, "arguments": call.arguments} for call in calls]


def images_to_data(images: Sequence[Image] | None) -> list[dict[str, str]] | None:
    if images is None:
        return None
    return [{"media_type": image.media_type, "data": image.data} for image in images]


def message_to_data(message: ChatMessage) -> dict[str, Any]:
    """Every public field of ``message`` as JSON-ready data."""
    trimmed, excluded = stored_marks(message)
    return {
        "id": message.id, "role": message.role, "content": message.content,
        "tool_calls": tool_calls_to_data(message.tool_calls), "tool_call_id": message.tool_call_id,
        "images": images_to_data(message.images), "name": message.name,
        "breadcrumb": message.breadcrumb, "summary": message.summary, "trimmed": trimmed,
        "excluded": excluded, "interrupted": message.interrupted, "turn_id": message.turn_id,
    }


def message_from_data(data: dict[str, Any]) -> ChatMessage:
    """The inverse of ``message_to_data``; the shape is trusted (validate untrusted input first)."""
    calls = data.get("tool_calls")
    images = data.get("images")
    return ChatMessage(
        role=data["role"], content=data["content"],
        tool_calls=None if calls is None else [ToolCall(c["id"], c["name"], c["arguments"]) for c in calls],
        tool_call_id=data.get("tool_call_id"),
        images=None if images is None else [Image(i["media_type"], i["data"]) for i in images],
        name=data.get("name"), breadcrumb=bool(data.get("breadcrumb")),
        summary=bool(data.get("summary")),
        left_out=left_out_from(bool(data.get("trimmed")), data.get("excluded")),
        interrupted=bool(data.get("interrupted")),
        turn_id=data.get("turn_id"), id=data["id"],
    )


def call_to_data(call: CallRecord) -> dict[str, Any]:
    return {"turn_id": call.turn_id, "provider": call.provider, "model": call.model,
            "route_kind": call.route_kind, "input_tokens": call.input_tokens,
            "output_tokens": call.output_tokens, "tokens_source": call.tokens_source,
            "cost_usd": call.cost_usd, "created_at": call.created_at}
