"""How the offline demo model uses tools other than its own lookup (an MCP server's, say), so the
tool loop can be watched with no real model: a message that names words of an offered tool's name
calls that tool, with arguments made from its schema; the result is then quoted back.

Arguments: each required property gets a value of its type (an enum's first value, 1, true); a
string named like a time zone gets the IANA zone of a place the message names ("Tokyo" ->
"Asia/Tokyo", else "UTC"); any other string gets the message itself. A toy, as the demo is: a real
model reads the schema, this one only fills it.
"""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Sequence
from functools import cache
from typing import Any

from server.history.messages import ChatMessage
from server.providers.base import ToolSpec

OWN_TOOL = "lookup_document"
QUOTED_CHARS = 600  # what of a tool's result the demo quotes back
_WORD = re.compile(r"[a-z]{3,}")
_FILLER = {"get", "set", "the", "and", "for", "with", "list", "current"}


def name_words(name: str) -> set[str]:
    """``time__get_current_time`` -> {"time"}: the words a message may call the tool by."""
    return set(_WORD.findall(name.lower().replace("_", " "))) - _FILLER


def pick_tool(text: str, tools: Sequence[ToolSpec]) -> ToolSpec | None:
    """The offered tool (not the demo's own) whose name shares the most words with ``text``."""
    said = set(_WORD.findall(text.lower()))
    scored = [(len(name_words(t.name) & said), -n, t) for n, t in enumerate(tools) if t.name != OWN_TOOL]
    best = max(scored, default=None, key=lambda entry: entry[:2])
    return best[2] if best is not None and best[0] > 0 else None


def arguments(tool: ToolSpec, text: str) -> dict[str, Any]:
    schema = tool.parameters if isinstance(tool.parameters, dict) else {}
    properties = schema.get("properties") or {}
    return {name: value_for(name, properties.get(name) or {}, text) for name in schema.get("required") or []}


def value_for(name: str, spec: dict[str, Any], text: str) -> Any:
    if spec.get("enum"):
        return spec["enum"][0]
    kind = spec.get("type")
    if kind in ("integer", "number"):
        return 1
    if kind == "boolean":
        return True
    if kind in ("array", "object"):
        return [] if kind == "array" else {}
    if "zone" in name.lower():
        return zone_named_in(text)
    return text


def zone_named_in(text: str) -> str:
    """The zone of the first place ``text`` names (one to three words: "Tokyo", "New York")."""
    places = zones_by_place()
    words = re.findall(r"[a-z]+", text.lower())
    for start in range(len(words)):
        for length in (3, 2, 1):
            place = " ".join(words[start:start + length])
            if place in places:
                return places[place]
    return "UTC"


@cache
def zones_by_place() -> dict[str, str]:
    """``"tokyo"`` -> ``"Asia/Tokyo"``, for every place the system's time zone database names."""
    return {zone.rsplit("/", 1)[-1].replace("_", " ").lower(): zone
            for zone in sorted(zoneinfo.available_timezones()) if "/" in zone}


def quote_result(result: ChatMessage) -> str:
    body = result.content.strip()
    shown = body if len(body) <= QUOTED_CHARS else body[:QUOTED_CHARS] + " ..."
    return (f"The tool `{result.name or 'tool'}` answered ({len(body):,} characters):\n\n"
            f"```\n{shown}\n```\n\nI am the offline demo: a real model would read that and answer in "
            f"its own words.")
