"""What each user spent this month: sessions, tokens and cost (the admin listing)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from server.store.users import UsageRow


def month_start(now: datetime | None = None) -> str:
    """The first instant of the current UTC month, as the store's timestamps spell it."""
    now = now or datetime.now(UTC)
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0).isoformat(timespec="microseconds")


def usage_rows(rows: list[UsageRow]) -> list[dict[str, Any]]:
    return [{**row.user.public(), "sessions": row.sessions, "input_tokens": row.input_tokens,
             "output_tokens": row.output_tokens, "cost_usd": round(row.cost_usd, 6)} for row in rows]


def usage_table(rows: list[UsageRow]) -> str:
    lines = ["name\trole\tsessions\tinput_tokens\toutput_tokens\tcost_usd"]
    for row in rows:
        lines.append(f"{row.user.name}\t{row.user.role}{' (disabled)' if row.user.disabled else ''}\t"
                     f"{row.sessions}\t{row.input_tokens}\t{row.output_tokens}\t{row.cost_usd:.4f}")
    return "\n".join(lines)
