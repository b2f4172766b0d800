"""Limits on what a media input may cost, left in force by the target (vLLM PR #47010).

PIL refuses to open an image over its pixel limit (``Image.MAX_IMAGE_PIXELS``, 89,478,485 pixels
by default; an image over twice that raises ``DecompressionBombError`` from its header alone,
before anything is decoded). The limit is one setting of the whole process: a model or processor
module that switches it off at import (``Image.MAX_IMAGE_PIXELS = None``) lets every image the
engine opens be decoded however large, a few kilobytes of file into gigabytes of pixels.
Importing the target must leave the limit in force, at most PIL's default.
"""

from __future__ import annotations

import io
import struct
import zlib

import pytest

pytestmark = pytest.mark.concern("media")

#: PIL's documented default pixel limit: ``1024 * 1024 * 1024 // 4 // 3``.
PIL_DEFAULT_LIMIT = 89_478_485
#: A header-only PNG's size: 400,000,000 pixels, over twice the default limit.
BOMB_SIDE = 20_000


def png_header(width: int, height: int) -> bytes:
    """A PNG file of a ``width`` x ``height`` 1-bit grey image with no pixel data: its header
    alone, what PIL reads to size an image before decoding it."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


def test_the_image_pixel_limit_stays_in_force(target):
    limit = target.image_pixel_limit()
    assert limit is not None, (
        "Image.MAX_IMAGE_PIXELS: expected a limit of at most "
        f"{PIL_DEFAULT_LIMIT} pixels once the target is imported, got None (switched off)"
    )
    assert limit <= PIL_DEFAULT_LIMIT, (
        f"Image.MAX_IMAGE_PIXELS: expected at most PIL's default {PIL_DEFAULT_LIMIT} pixels once "
        f"the target is imported, got {limit}"
    )


def test_an_image_over_the_limit_is_refused_unread(target):
    from PIL import Image

    target.image_pixel_limit()  # the target imported
    pixels = BOMB_SIDE * BOMB_SIDE
    try:
        with Image.open(io.BytesIO(png_header(BOMB_SIDE, BOMB_SIDE))) as image:
            size = image.size
    except Image.DecompressionBombError as e:
        assert str(pixels) in str(e), f"the error does not name the image's {pixels} pixels: {e}"
        return
    pytest.fail(
        f"a {BOMB_SIDE} x {BOMB_SIDE} image ({pixels} pixels, over twice PIL's default limit) "
        f"was opened as {size} with no error: the pixel limit is not in force "
        f"(Image.MAX_IMAGE_PIXELS = {Image.MAX_IMAGE_PIXELS})"
    )
