"""Built-in tools the turn loop can run: a document lookup returning long text (seed 004's novel
lookup), so tool loops, tool-result caps and trimming can be watched on the offline demo.

A tool is a ``ToolSpec`` plus an async function from its arguments to text. Unknown tools and bad
arguments produce an error text for the model, never an exception in the turn loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from server.providers.base import ToolSpec

_OPENINGS = {
    "harbour letters": "Morning fog wrapped the harbour like an unopened letter. Lin, on the night shift at"
    " the old post office, found a blue envelope with no postmark, addressed to his mother, who had"
    " vanished thirty years before. Inside was a single line: do not let the lighthouse go dark.",
    "paper moon": "Every night a moon made of paper rose over the small town, so thin that starlight"
    " showed through it. Amin, the town's only moon-mender, stitched its tears with silver thread,"
    " until one night she found an upside-down city inside a tear.",
    "seventh garden": "Behind the palace lay six gardens that bloomed in every season, but nobody had"
    " ever seen the seventh. Lu An, the gardener's boy, heard his own name called from inside the"
    " wall while he pruned the roses.",
    "chess in the rain": "It had rained on the south bank for seven days when an old man without an"
    " umbrella came into the tea house, set out a board, and said that a win would return one lost"
    " thing.",
    "spark train": "At midnight a train with no tickets stopped at the abandoned station, its windows"
    " full of starlight. Chi Ye climbed into the last carriage to look for the father who had left.",
}
_CHAPTER = (
    " The chapter goes on for many pages: the streets, the weather, the small talk of neighbours, the"
    " letters that arrive and the ones that never do, each described with patient care so that the"
    " reader lives inside the place before anything happens."
)

LOOKUP_DOCUMENT = ToolSpec(
    name="lookup_document",
    description="Look up a short novel by title and return its full text. Known titles: "
    + ", ".join(sorted(_OPENINGS)) + ".",
    parameters={
        "type": "object",
        "properties": {"title": {"type": "string", "description": "The title to look up"}},
        "required": ["title"],
    },
)


def _match_title(title: str) -> str | None:
    wanted = title.lower().strip(" \"'《》")
    for known in _OPENINGS:
        if known in wanted or wanted in known:
            return known
    return None


async def lookup_document(arguments: dict[str, Any]) -> str:
    title = arguments.get("title")
    if not isinstance(title, str) or not title.strip():
        return "error: lookup_document needs a string argument 'title'"
    known = _match_title(title)
    if known is None:
        return f"No document titled {title!r} was found. Known titles: {', '.join(sorted(_OPENINGS))}."
    return f"# {known.title()}\n\n" + _OPENINGS[known] + _CHAPTER * 12


ToolFunction = Callable[[dict[str, Any]], Awaitable[str]]
BUILTIN_TOOLS: dict[str, tuple[ToolSpec, ToolFunction]] = {
    LOOKUP_DOCUMENT.name: (LOOKUP_DOCUMENT, lookup_document),
}


def tool_specs() -> list[ToolSpec]:
    return [spec for spec, _ in BUILTIN_TOOLS.values()]


def known_titles() -> list[str]:
    return sorted(_OPENINGS)


async def run_tool(name: str, arguments: dict[str, Any]) -> str:
    entry = BUILTIN_TOOLS.get(name)
    if entry is None:
        return f"error: unknown tool {name!r}; available: {', '.join(BUILTIN_TOOLS)}"
    return await entry[1](arguments)
