"""Attached images are checked before anything is stored."""

from __future__ import annotations

import base64

import pytest

from server.errors import ImageRejected
from server.history.messages import Image
from server.protocol import ImagePayload
from server.sessions.images import decode_images

DATA = base64.b64encode(b"\x89PNG" + b"\x00" * 60).decode()


def test_decode_images_accepts_supported_types_within_the_limit():
    images = decode_images([ImagePayload("image/png", DATA), ImagePayload("image/webp", DATA)], 64)
    assert images == [Image("image/png", DATA), Image("image/webp", DATA)]


@pytest.mark.parametrize("payload, limit, words", [
    (ImagePayload("image/bmp", DATA), 1000, "image 1: 'image/bmp' is not supported"),
    (ImagePayload("image/png", "not base64!"), 1000, "image 1: data is not valid base64"),
    (ImagePayload("image/png", DATA), 10, "image 1 is 64 bytes; the limit is 10 bytes"),
])
def test_decode_images_rejects_with_the_rule_it_broke(payload, limit, words):
    with pytest.raises(ImageRejected, match=words.replace("(", r"\(")):
        decode_images([payload], limit)
