"""An MCP ``CallToolResult`` as the turn loop records it: text for the model, images beside it.

Content kinds: text as is; an embedded text resource as its text under its URI; an embedded blob or
a resource link as one line naming it; audio as one line (no dialect here takes audio from a
tool); images as ``Image`` attachments (the seed's tool-declared images: counted and sent in the
current turn only) when their type is one the providers take and they fit ``max_image_bytes``, else
one line saying why they were left out. ``structuredContent`` is sent as JSON text when the result
has no text block (a server that sends both mirrors the JSON in its text, per the specification).
``isError`` marks the whole output as a tool error for the model.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types

from server.history.messages import Image

IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")


@dataclass(frozen=True)
class ToolOutput:
    """What a tool call gave: ``text`` for the model (uncapped here), its ``images``, and whether the
    tool (or meterchat on its behalf) reported an error."""

    text: str
    is_error: bool = False
    images: list[Image] = field(default_factory=list)


def tool_error(message: str) -> ToolOutput:
    return ToolOutput(f"error: {message}", is_error=True)


def from_result(result: types.CallToolResult, max_image_bytes: int) -> ToolOutput:
    parts: list[str] = []
    images: list[Image] = []
    has_text = False
    for block in result.content:
        if isinstance(block, types.TextContent):
            has_text = True
            parts.append(block.text)
        elif isinstance(block, types.ImageContent):
            image, note = _image(block, max_image_bytes)
            if image is not None:
                images.append(image)
            parts.append(note)
        else:
            parts.append(_other(block))
    if result.structured_content is not None and not has_text:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n\n".join(part for part in parts if part)
    if result.is_error:
        text = f"error: {text or 'the tool reported an error'}"
    return ToolOutput(text, bool(result.is_error), images)


def _image(block: types.ImageContent, max_image_bytes: int) -> tuple[Image | None, str]:
    if block.mime_type not in IMAGE_TYPES:
        return None, f"[image of type {block.mime_type} left out: not a type the model takes]"
    try:
        size = len(base64.b64decode(block.data, validate=True))
    except (binascii.Error, ValueError):
        return None, "[image left out: its data is not base64]"
    if size > max_image_bytes:
        return None, f"[image of {size:,} bytes left out: over runtime.max_image_bytes]"
    return Image(block.mime_type, block.data), f"[image: {block.mime_type}, {size:,} bytes]"


def _other(block: Any) -> str:
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, types.TextResourceContents):
            return f"[resource {resource.uri}]\n{resource.text}"
        return f"[binary resource {resource.uri} ({resource.mime_type or 'unknown type'}) not shown]"
    if isinstance(block, types.ResourceLink):
        return f"[resource link {block.uri}: {block.name}]"
    if isinstance(block, types.AudioContent):
        return f"[audio ({block.mime_type}) not shown]"
    return f"[{getattr(block, 'type', 'unknown')} content not shown]"
