"""Images a client attaches to a message: checked before anything is stored, served back by URL.

A payload is accepted when its media type is one of ``IMAGE_TYPES``, its data is valid base64 and the
decoded size is within ``runtime.max_image_bytes``; anything else is an ``ImageRejected`` naming the
image and the rule. A stored image is served at ``GET /api/sessions/{id}/images/{message_id}/{n}``
(behind the token like all of ``/api``) with its own media type, so the ``history`` frame carries
URLs, not the bytes; only the checked types are ever stored, so nothing served is script or markup.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable

from starlette.responses import Response

from server.errors import ImageRejected, UnknownSession
from server.history.messages import ChatMessage, Image
from server.protocol import ImagePayload, echo

IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")


def decode_images(payloads: list[ImagePayload], limit: int) -> list[Image]:
    return [_decode(index, payload, limit) for index, payload in enumerate(payloads)]


def _decode(index: int, payload: ImagePayload, limit: int) -> Image:
    if payload.media_type not in IMAGE_TYPES:
        raise ImageRejected(f"image {index + 1}: {payload.media_type!r} is not supported; "
                            f"send one of {', '.join(IMAGE_TYPES)}")
    try:
        size = len(base64.b64decode(payload.data, validate=True))
    except (binascii.Error, ValueError) as exc:
        raise ImageRejected(f"image {index + 1}: data is not valid base64") from exc
    if size > limit:
        raise ImageRejected(f"image {index + 1} is {size:,} bytes; the limit is {limit:,} bytes "
                            f"(runtime.max_image_bytes)")
    return Image(payload.media_type, payload.data)


def find_image(messages: Iterable[ChatMessage], message_id: str, index: int) -> Image:
    for message in messages:
        if message.id == message_id and message.images and 0 <= index < len(message.images):
            return message.images[index]
    raise UnknownSession(f"no image {index} on message {echo(message_id)} in this session")


def image_response(image: Image) -> Response:
    # Private: behind the token; the bytes of a stored image never change, so the browser keeps them.
    headers = {"Cache-Control": "private, max-age=31536000, immutable",
               "X-Content-Type-Options": "nosniff", "Content-Security-Policy": "default-src 'none'"}
    return Response(base64.b64decode(image.data), media_type=image.media_type, headers=headers)
