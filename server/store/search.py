"""The session list's query, one builder for both stores: newest first (``updated_at``, then id),
only the sessions whose title contains the query or whose message text has every word of it as a
prefix (migration 3's index: SQLite's FTS5 table ``message_text``, PostgreSQL's GIN index), after
the row ``(before, before_id)`` in that order (the last row of the previous page; ``before`` alone:
updated before it), at most ``limit`` rows. A ``Dialect`` says how each store spells that.

The page boundary is the whole sort key, not the time alone: two sessions updated in the same
microsecond (two instances, or two workers, each with its own clock) are both listed, one per page
boundary, instead of the second being skipped.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from server.store.migrations import PG_MESSAGE_TEXT

SUMMARY = ("SELECT s.id, s.title, s.route, s.created_at, s.updated_at, "
           "(SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id) FROM sessions s")


@dataclass(frozen=True)
class Dialect:
    mark: str  # the parameter placeholder
    title_like: str  # LIKE, or ILIKE for any case
    words: re.Pattern[str]  # what counts as a word of the query
    text_match: str  # session ids whose message text matches the terms (one placeholder)
    terms: Callable[[list[str]], str]  # the words as the text index's prefix query
    no_limit: Any  # the LIMIT value that means all rows


SQLITE = Dialect("?", "LIKE", re.compile(r"\w+"),
                 "SELECT session_id FROM message_text WHERE message_text MATCH ?",
                 lambda words: " ".join(f'"{word}"*' for word in words), -1)
POSTGRES = Dialect("%s", "ILIKE", re.compile(r"[^\W_]+"),
                   f"SELECT session_id FROM messages WHERE {PG_MESSAGE_TEXT} @@ to_tsquery('simple', %s)",
                   lambda words: " & ".join(f"{word}:*" for word in words), None)


def search_sql(dialect: Dialect, query: str, before: str | None, limit: int | None,
               before_id: str | None = None, owner: str | None = None) -> tuple[str, tuple[Any, ...]]:
    """The session summaries ``query`` finds (all of them for an empty query), as SQL and parameters;
    only ``owner``'s when one is given."""
    where: list[str] = []
    params: list[Any] = []
    if owner is not None:
        where.append(f"s.owner_id = {dialect.mark}")
        params.append(owner)
    words = dialect.words.findall(query)
    if query.strip():
        like = "%" + re.sub(r"([%_\\])", r"\\\1", query.strip()) + "%"
        text = f" OR s.id IN ({dialect.text_match})" if words else ""
        where.append(f"(s.title {dialect.title_like} {dialect.mark} ESCAPE '\\'{text})")
        params += [like, dialect.terms(words)] if words else [like]
    if before and before_id:
        mark = dialect.mark
        where.append(f"(s.updated_at < {mark} OR (s.updated_at = {mark} AND s.id > {mark}))")
        params += [before, before, before_id]
    elif before:
        where.append(f"s.updated_at < {dialect.mark}")
        params.append(before)
    sql = SUMMARY + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY s.updated_at DESC, s.id"
    return f"{sql} LIMIT {dialect.mark}", (*params, dialect.no_limit if limit is None else limit)
