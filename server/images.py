"""Images a client attaches to a message: checked before anything is stored.

A payload is accepted when its media type is one of ``IMAGE_TYPES``, its data is valid base64 and the
decoded size is within ``runtime.max_image_bytes``; anything else is an ``ImageRejected`` naming the
image and the rule.
"""

from __future__ import annotations

import base64
import binascii

from server.errors import ImageRejected
from server.history import Image
from server.protocol import ImagePayload

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
