"""What a model is offered: MCP tools under names unique across servers, bounded per server.

A tool ``get_time`` of the server ``time`` is offered as ``time__get_time``. Names keep to the
charset and length every provider dialect accepts (``[A-Za-z0-9_-]``, at most 64 characters): other
characters become ``_``, and a name that had to change or be shortened gets a short hash of the
original, so two tools never share a name and a tool keeps its name from one start to the next.

``bounded_tools`` keeps a server's listing within its ``max_tools`` and ``max_schema_bytes``: the
first tools in the server's order that fit, each left out one logged by name.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from server.config.settings import McpServerSettings
from server.providers.base import ToolSpec

log = logging.getLogger(__name__)

SEPARATOR = "__"
MAX_NAME = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class McpTool:
    """One tool of one server: ``spec`` is what the model sees (its name the model-facing one)."""

    server: str
    tool: str  # the server's own name for it
    spec: ToolSpec
    approve: str  # never | always


def model_name(server: str, tool: str) -> str:
    """The stable model-facing name of ``tool`` on ``server``."""
    name = f"{server}{SEPARATOR}{tool}"
    safe = _UNSAFE.sub("_", name)
    if safe == name and len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:8]
    return f"{safe[:MAX_NAME - 9]}_{digest}"


def schema_bytes(spec: ToolSpec) -> int:
    return len(json.dumps([spec.name, spec.description, spec.parameters]).encode("utf-8"))


def to_spec(server: str, tool: str, description: str | None, schema: dict[str, Any] | None) -> ToolSpec:
    parameters = schema if isinstance(schema, dict) and schema else EMPTY_SCHEMA
    return ToolSpec(model_name(server, tool), description or "", parameters)


def bounded_tools(settings: McpServerSettings,
                  listed: Iterable[tuple[str, str | None, Any]]) -> list[McpTool]:
    """The tools of ``listed`` (name, description, input schema) that fit the server's bounds."""
    kept: list[McpTool] = []
    names: set[str] = set()
    used = 0
    left_out: list[str] = []
    for tool, description, schema in listed:
        spec = to_spec(settings.name, tool, description, schema)
        size = schema_bytes(spec)
        if len(kept) >= settings.max_tools or used + size > settings.max_schema_bytes or spec.name in names:
            left_out.append(tool)
            continue
        used += size
        names.add(spec.name)
        kept.append(McpTool(settings.name, tool, spec, settings.approval(tool)))
    if left_out:
        log.warning("MCP server %s: %d tools left out (max_tools %d, max_schema_bytes %d): %s",
                    settings.name, len(left_out), settings.max_tools, settings.max_schema_bytes,
                    ", ".join(left_out[:20]) + (" ..." if len(left_out) > 20 else ""))
    return kept


def selected(tools: Sequence[McpTool], selection: bool | list[str]) -> list[McpTool]:
    """The tools a provider's ``tools`` setting offers: all (true), none (false), or those whose
    server or ``server/tool`` the list names."""
    if selection is True:
        return list(tools)
    if selection is False:
        return []
    wanted = set(selection)
    return [t for t in tools if t.server in wanted or f"{t.server}/{t.tool}" in wanted]
