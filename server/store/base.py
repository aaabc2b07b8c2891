"""The session store: what it keeps and the interface every backend implements.

A session is a title, a route, an ordered transcript of ``ChatMessage`` (every mark and the turn id
kept) and the list of provider calls it made. ``Store`` is the contract the session code calls; the
embedded SQLite backend (``server.store.sqlite``) is the default; PostgreSQL (``server.store.postgres``)
is the server-grade one several instances can share, chosen by ``[store] url``. Both run the same
numbered schema migrations (``server.store.migrations``) when opened.

Contract of the write methods: when the awaited call returns, the write is committed (a crash after
that point loses nothing). ``append_messages`` adds after the last message; ``save_messages``
upserts by message id (content and marks of a known id are replaced, its position kept; an unknown
id is appended), which is how a streaming reply is flushed at intervals and how trims are recorded,
and records the provider ``calls`` given with them in the same transaction (a turn's reply and its
call: one write);
``save_batch`` does what ``save_messages`` does for several sessions in one transaction (a session no
longer stored is skipped, not an error: the streaming replies of every session are flushed so);
``insert_message`` places one message at an index (a breadcrumb or summary after the system
messages). Methods naming a session that is not stored raise ``UnknownSession``. Timestamps are
ISO-8601 UTC strings with microseconds, so they sort as text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from datetime import UTC, datetime, timedelta
from types import UnionType
from typing import Any, Protocol, Union, get_args, get_origin, get_type_hints

from server.history.messages import ChatMessage, left_out_from, stored_marks
from server.store.users import UserStore


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
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class StoredSession:
    id: str
    title: str
    route: str
    created_at: str
    updated_at: str
    messages: list[ChatMessage] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)
    trims: list[dict[str, Any]] = field(default_factory=list)  # history_trimmed fields, oldest first
    notices: list[dict[str, Any]] = field(default_factory=list)  # the page's other lines, oldest first
    owner: str | None = None  # the owning user's id; None: nobody's (no accounts, or before them)


class Store(UserStore, Protocol):
    async def close(self) -> None: ...

    async def ping(self) -> None: ...  # raises StoreUnavailable when the store cannot answer

    # ``owner``: the user id owning it (accounts), None in the modes where nobody owns anything
    async def create_session(self, session_id: str, *, title: str, route: str,
                             owner: str | None = None) -> None: ...

    async def get_session(self, session_id: str) -> StoredSession | None: ...

    async def get_summary(self, session_id: str) -> SessionSummary | None: ...

    # newest first; ``query`` matches titles and message text; ``before`` and ``before_id``, the
    # last row of the previous page (``server.store.search``); only ``owner``'s when given
    async def list_sessions(self, query: str = "", before: str | None = None, limit: int | None = None,
                            before_id: str | None = None,
                            owner: str | None = None) -> list[SessionSummary]: ...

    async def rename_session(self, session_id: str, title: str) -> None: ...

    async def set_route(self, session_id: str, route: str) -> None: ...

    async def delete_session(self, session_id: str) -> None: ...

    async def append_messages(self, session_id: str, messages: Sequence[ChatMessage]) -> None: ...

    async def save_messages(self, session_id: str, messages: Sequence[ChatMessage],
                            calls: Sequence[CallRecord] = ()) -> None: ...

    async def save_batch(self, batch: Mapping[str, Sequence[ChatMessage]]) -> None: ...

    async def insert_message(self, session_id: str, index: int, message: ChatMessage) -> None: ...

    async def record_call(self, session_id: str, call: CallRecord) -> None: ...

    async def record_trim(self, session_id: str, trim: Mapping[str, Any],
                          marked: Sequence[ChatMessage] = ()) -> None: ...

    # an error, notice, switch or command line of the transcript (``server.sessions.notices``)
    async def record_notice(self, session_id: str, notice: Mapping[str, Any]) -> None: ...

    async def import_session(self, session: StoredSession, owner: str | None = None) -> None: ...
    # windows providers named in their overflow errors, by (provider alias, model)
    async def load_windows(self) -> dict[tuple[str, str], int]: ...
    async def save_window(self, provider: str, model: str, tokens: int) -> None: ...


class Clock:
    """UTC ISO-8601 timestamps, strictly increasing within a store so "newest first" is exact."""

    def __init__(self) -> None:
        self._last = datetime.fromtimestamp(0, UTC)

    def now(self) -> str:
        current = datetime.now(UTC)
        if current <= self._last:
            current = self._last + timedelta(microseconds=1)
        self._last = current
        return current.isoformat(timespec="microseconds")


# Message <-> plain data: one codec shared by the SQLite rows and the JSON export, derived from the
# dataclass fields, so a field added to ChatMessage is stored and exported without being listed here.

def type_options(hint: Any) -> tuple[Any, ...]:
    """The members of a union hint (``str | None`` is (str, NoneType)); any other hint alone."""
    return get_args(hint) if get_origin(hint) in (Union, UnionType) else (hint,)


def _item_type(hint: Any) -> type | None:
    """``X`` for a ``list[X]`` or ``list[X] | None`` field: the dataclass each list item becomes."""
    for option in type_options(hint):
        if get_origin(option) is list:
            item: type = get_args(option)[0]
            return item
    return None


def _object_type(hint: Any) -> type | None:
    """``X`` for an ``X | None`` field whose ``X`` is a dataclass: kept as one JSON object."""
    for option in type_options(hint):
        if is_dataclass(option) and isinstance(option, type):
            return option
    return None


# ``left_out`` is kept as version 1 spelled it, a ``trimmed`` flag and an ``excluded`` reason in its
# place (``history.stored_marks``), so the files and exports written before read the same.
LEFT_OUT_AS: dict[str, Any] = {"trimmed": bool, "excluded": str | None}


def _stored_hints() -> dict[str, Any]:
    """Stored name -> type hint of every public field of ``ChatMessage``, ``id`` first: the order
    of the export's keys and of the store's columns."""
    hints = get_type_hints(ChatMessage)
    stored: dict[str, Any] = {"id": hints["id"]}
    for f in fields(ChatMessage):
        if f.name == "left_out":
            stored.update(LEFT_OUT_AS)
        elif f.name != "id" and not f.name.startswith("_"):
            stored[f.name] = hints[f.name]
    return stored


# The one table the store's columns and the export's fields are read from.
MESSAGE_HINTS: dict[str, Any] = _stored_hints()
MESSAGE_FIELDS: tuple[str, ...] = tuple(MESSAGE_HINTS)
MESSAGE_FLAGS = frozenset(name for name, hint in MESSAGE_HINTS.items() if hint is bool)
MESSAGE_LISTS: dict[str, type] = {name: kind for name, hint in MESSAGE_HINTS.items()
                                  if (kind := _item_type(hint)) is not None}
MESSAGE_OBJECTS: dict[str, type] = {name: kind for name, hint in MESSAGE_HINTS.items()
                                    if (kind := _object_type(hint)) is not None}
MESSAGE_JSON: tuple[str, ...] = (*MESSAGE_LISTS, *MESSAGE_OBJECTS)  # JSON text in a SQLite column
_ITEM_FIELDS = {kind: tuple(f.name for f in fields(kind))
                for kind in (*MESSAGE_LISTS.values(), *MESSAGE_OBJECTS.values())}
CALL_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(CallRecord))


def object_data(value: Any) -> dict[str, Any]:
    """A list item or an object field of a message (a ``ToolCall``, an ``Image``, a ``ServedBy``)
    as JSON-ready data: every field, in its declared order."""
    return {key: getattr(value, key) for key in _ITEM_FIELDS[type(value)]}


def message_to_data(message: ChatMessage) -> dict[str, Any]:
    """Every public field of ``message`` as JSON-ready data."""
    marks: dict[str, Any] = dict(zip(LEFT_OUT_AS, stored_marks(message), strict=True))
    data = {name: marks[name] if name in marks else getattr(message, name) for name in MESSAGE_FIELDS}
    for name in MESSAGE_LISTS:
        if data[name] is not None:
            data[name] = [object_data(item) for item in data[name]]
    for name in MESSAGE_OBJECTS:
        if data[name] is not None:
            data[name] = object_data(data[name])
    return data


def message_from_data(data: Mapping[str, Any]) -> ChatMessage:
    """The inverse of ``message_to_data``; the shape is trusted (validate untrusted input first).
    A field missing from ``data`` takes the dataclass default; flags are read as truthiness (the
    store keeps them as 0/1)."""
    values = {name: data[name] for name in MESSAGE_FIELDS if name in data and name not in LEFT_OUT_AS}
    for name, kind in MESSAGE_LISTS.items():
        if values.get(name) is not None:
            values[name] = [kind(**item) for item in values[name]]
    for name, kind in MESSAGE_OBJECTS.items():
        if values.get(name) is not None:
            values[name] = kind(**values[name])
    for name in MESSAGE_FLAGS & values.keys():
        values[name] = bool(values[name])
    values["left_out"] = left_out_from(bool(data.get("trimmed")), data.get("excluded"))
    return ChatMessage(**values)


def call_to_data(call: CallRecord) -> dict[str, Any]:
    return {name: getattr(call, name) for name in CALL_FIELDS}
