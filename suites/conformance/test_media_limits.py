"""Limits on what a media input may cost, left in force by the target (vLLM PR #47010).

PIL refuses to open an image over its pixel limit (``Image.MAX_IMAGE_PIXELS``, 89,478,485 pixels
by default; an image over twice that raises ``DecompressionBombError`` from its header alone,
before anything is decoded). The limit is one setting of the whole process: a model or processor
module that switches it off at import (``Image.MAX_IMAGE_PIXELS = None``) lets every image the
engine opens be decoded however large, a few kilobytes of file into gigabytes of pixels.
Importing the target must leave the limit in force, at most PIL's default.

A video's audio track (vLLM PR #50221): with ``use_audio_in_video`` the processor decodes the
track of each video file it is given, and the track is bounded as any audio is, by the engine's
audio decode cap (``VLLM_MAX_AUDIO_DECODE_DURATION_S``, whole seconds): a small file can hold a
track hours long. A track under the cap is the video's audio item; a track over it is never
decoded whole, and the user sees the cap: the request is refused with an error naming it, or the
track is cut to it.
"""

from __future__ import annotations

import io
import re
import struct
import zlib

import pytest

from harness.inputs.media import video_file_with_audio, video_file_without_audio
from harness.inputs.requests import AUDIO_DECODE_CAP_ENV, PLACEHOLDER, ProcessedRequest, Request
from harness.targets.base import NeedsCuda, NotImplementedByTarget

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


# ---------------------------------------------------------------------------------------------
# A video's audio track

#: The audio decode cap these checks set (``VLLM_MAX_AUDIO_DECODE_DURATION_S``, whole seconds).
AUDIO_CAP_S = 3
#: Track lengths either side of the cap, chosen so that a decoder's few lost samples at the end
#: (resampling) leave the placeholder count unchanged.
UNDER_CAP_S = 2.0
OVER_CAP_S = 5.0


def audio_placeholders(seconds: float) -> int:
    """The architecture's audio token rule for a track of ``seconds``: 16 kHz samples, hop 160
    -> 100 feature frames a second, in 30 s clips (3000 frames); each clip through three stride-2
    convolutions, L -> ceil(L / 2)."""
    frames = round(seconds * 100)
    total = 0
    for start in range(0, frames, 3000):
        length = min(3000, frames - start)
        for _ in range(3):
            length = -(-length // 2)
        total += length
    return total


@pytest.fixture
def audio_cap(monkeypatch: pytest.MonkeyPatch) -> int:
    """The engine's audio decode cap set to :data:`AUDIO_CAP_S` for one check (vLLM reads the
    variable at each decode, the reference target at each request)."""
    monkeypatch.setenv(AUDIO_DECODE_CAP_ENV, str(AUDIO_CAP_S))
    return AUDIO_CAP_S


def _audio_in_video(seconds: float | None, seed: int) -> Request:
    video = (
        video_file_without_audio(seed) if seconds is None else video_file_with_audio(seconds, seed)
    )
    return Request(f"Watch {PLACEHOLDER['video']} closely.", videos=[video], audio_in_video=True)


def _modalities(processed: ProcessedRequest) -> list[str]:
    return [item.modality for item in processed.items]


def _over_the_cap(make_model) -> tuple[ProcessedRequest | None, Exception | None]:
    """A video whose track is over the cap through the target's processor: what it made, or
    what it raised."""
    model = make_model()
    try:
        return model.process_request(_audio_in_video(OVER_CAP_S, 41)), None
    except (NotImplementedByTarget, NeedsCuda):
        raise  # a skip with the target's reason, not an outcome
    except Exception as e:
        return None, e


def _assert_names_the_cap(error: Exception) -> None:
    assert re.search(rf"\b{AUDIO_CAP_S}(\.0+)?\s*s\b", str(error)), (
        f"a {OVER_CAP_S:g} s audio track over the {AUDIO_CAP_S} s cap was refused with an error "
        f"that does not name the cap: {type(error).__name__}: {error}"
    )


@pytest.mark.concern("requests")
def test_a_video_track_under_the_cap_is_its_audio_item(make_model, audio_cap):
    """A 2 s track under the 3 s cap follows its video as one audio item, encoded as one clip:
    200 feature frames -> 100 -> 50 -> 25 placeholders."""
    model = make_model()
    result = model.run_request(_audio_in_video(UNDER_CAP_S, 40))
    kinds = [item.modality for item in result.items]
    assert kinds == ["video", "audio"], (
        f"items: expected the video then its {UNDER_CAP_S:g} s audio track (under the "
        f"{audio_cap} s cap), got {kinds}"
    )
    expected = audio_placeholders(UNDER_CAP_S)
    got = len(result.items[1].positions)
    assert got == expected, (
        f"audio placeholders of a {UNDER_CAP_S:g} s track: expected {expected}, got {got}"
    )
    assert model.calls.audio == [1], (
        f"audio encoder calls: expected one call with 1 clip, got clips per call "
        f"{model.calls.audio}"
    )


@pytest.mark.concern("requests")
def test_a_video_without_a_track_has_no_audio_item(make_model, audio_cap):
    processed = make_model().process_request(_audio_in_video(None, 42))
    assert _modalities(processed) == ["video"], (
        f"items: expected the video alone (the file has no audio track), got "
        f"{_modalities(processed)}"
    )


@pytest.mark.concern("requests")
def test_a_video_track_over_the_cap_is_not_decoded_whole(make_model, audio_cap):
    """vLLM PR #50221: the track is decoded under the cap, or not at all."""
    processed, error = _over_the_cap(make_model)
    if error is not None:
        _assert_names_the_cap(error)
        return
    assert processed is not None
    most = audio_placeholders(audio_cap)
    over = [len(i.positions) for i in processed.items if i.modality == "audio"]
    assert all(count <= most for count in over), (
        f"audio placeholders of a {OVER_CAP_S:g} s track over the {audio_cap} s cap: expected at "
        f"most {most} (the cap's), got {over} (the whole track: "
        f"{audio_placeholders(OVER_CAP_S)}): the track was decoded past the cap"
    )


@pytest.mark.concern("requests")
def test_a_video_track_over_the_cap_is_refused_or_cut_to_it(make_model, audio_cap):
    """The user sees the cap: an error naming it, or the track cut to it; never a request that
    goes on without the track and says nothing."""
    processed, error = _over_the_cap(make_model)
    if error is not None:
        _assert_names_the_cap(error)
        return
    assert processed is not None
    expected = audio_placeholders(audio_cap)
    counts = [len(i.positions) for i in processed.items if i.modality == "audio"]
    assert counts, (
        f"a {OVER_CAP_S:g} s audio track over the {audio_cap} s cap: expected an error naming the "
        f"cap or the track cut to it ({expected} placeholders); the request succeeded with no "
        f"audio item, the track dropped without an error (items {_modalities(processed)})"
    )
    assert counts == [expected], (
        f"audio placeholders of a {OVER_CAP_S:g} s track over the {audio_cap} s cap: expected "
        f"the track cut to the cap ({expected}), got {counts}"
    )
