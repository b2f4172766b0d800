"""A video file's audio track as an audio item (vLLM's ``use_audio_in_video``).

With the option set, the processor decodes each video file's audio track from the file's bytes
and makes it an audio item of the request. What every target must do:

- the track's placeholder (``<so_start>``, one context token per encoder frame, ``<so_end>``)
  follows its video's replacement directly, and has the architecture's token count for the
  track's length, whatever rate and channels the file stores it in (the engine mixes it down to
  mono and resamples it to the model's rate); a video whose file has no track stays alone, the
  next video unaffected;
- a video given as decoded frames without the file's bytes is refused with an error naming the
  missing bytes: there is no track to read;
- a file that is not a readable container is refused with an error naming it: the user asked
  for its track, and a request that goes on without it drops an input unsaid.

The decode cap on the track's length is in ``test_media_limits.py``; parity of the embeddings
with the reference (request forms ``*audio-in-video*``) in ``test_parity.py``.
"""

from __future__ import annotations

import dataclasses

import pytest

from harness.inputs.catalogue import FORMS_BY_NAME, REQUEST_FORMS
from harness.inputs.media import video_clip, video_file, video_file_with_audio
from harness.inputs.requests import PLACEHOLDER, Request, track_seconds
from harness.oracles.assertions import assert_clear_error, raises_clear_error
from harness.targets.base import NeedsCuda, NotImplementedByTarget
from reference_impl.tokenizer import AUDIO_START, shared_tokenizer
from suites.conformance.test_media_limits import audio_placeholders

pytestmark = pytest.mark.concern("requests")

AUDIO_IN_VIDEO_FORMS = [f.name for f in REQUEST_FORMS if f.request.audio_in_video]
#: Names an error about the video's file may use: vLLM's metadata key for its bytes, or the
#: request's item (``videos[0]``, ``videos[0].data``).
VIDEO_FILE_FIELDS = ("original_video_bytes", "videos[0]")


@pytest.mark.parametrize("form", AUDIO_IN_VIDEO_FORMS)
def test_each_track_follows_its_video(request_runs, form):
    request = FORMS_BY_NAME[form].request
    result = request_runs.run(form)
    expected_kinds: list[str] = []
    for video in request.videos:
        expected_kinds += ["video"] if track_seconds(video) is None else ["video", "audio"]
    kinds = [item.modality for item in result.items]
    assert kinds == expected_kinds, (
        f"items in prompt order: expected {expected_kinds} (each track after its video), got "
        f"{kinds}"
    )
    start = shared_tokenizer().encode(AUDIO_START, add_special_tokens=False)
    tracks = iter(s for s in map(track_seconds, request.videos) if s is not None)
    for before, item in zip(result.items, result.items[1:], strict=False):
        if item.modality != "audio":
            continue
        between = result.prompt_token_ids[before.positions[-1] + 1 : item.positions[0]]
        where = f"found {between} after {before.modality}[{before.index}]"
        assert before.modality == "video", f"audio[{item.index}]: not after a video: {where}"
        assert between == start, (
            f"audio[{item.index}]: expected right after its video's replacement, behind "
            f"{AUDIO_START} {start}; {where}"
        )
        seconds = next(tracks)
        assert len(item.positions) == audio_placeholders(seconds), (
            f"audio[{item.index}]: {len(item.positions)} placeholders for a {seconds:g} s track, "
            f"expected {audio_placeholders(seconds)}"
        )


#: Tracks the engine must decode to their length: the model's rate, vLLM's decode rate (22050
#: Hz, where its decoder skips the resampler), common camera rates; mono and stereo.
TRACK_FORMATS = [(16000, 1), (22050, 1), (22050, 2), (44100, 2), (48000, 1)]


@pytest.mark.parametrize(
    ("rate", "channels"), TRACK_FORMATS, ids=[f"{r}hz-{c}ch" for r, c in TRACK_FORMATS]
)
def test_a_track_has_its_length_whatever_its_rate_and_channels(make_model, rate, channels):
    """The same 2 s tone, stored at another rate or in two channels, is still 2 s of audio: the
    architecture's placeholder count for 2 s at the model's 16 kHz."""
    video = video_file(2, 64, 64, 52, audio_seconds=2.0, audio_rate=rate, audio_channels=channels)
    request = Request(f"Watch {PLACEHOLDER['video']}.", videos=[video], audio_in_video=True)
    processed = make_model().process_request(request)
    counts = [len(item.positions) for item in processed.items if item.modality == "audio"]
    expected = audio_placeholders(2.0)
    layout = "mono" if channels == 1 else "stereo"
    assert counts == [expected], (
        f"audio placeholders of a 2 s track stored at {rate} Hz {layout}: expected "
        f"[{expected}], got {counts}"
    )


def test_a_video_without_its_bytes_is_refused(make_model):
    """Frames alone (no file bytes) with ``audio_in_video``: there is no track to read."""
    request = Request(
        f"Watch {PLACEHOLDER['video']}.", videos=[video_clip(2, 64, 64, 50)], audio_in_video=True
    )
    with raises_clear_error(*VIDEO_FILE_FIELDS):
        make_model().process_request(request)


@pytest.mark.parametrize("damage", ["header-zeroed", "not-a-container"])
def test_a_corrupt_container_is_refused(make_model, damage):
    video = video_file_with_audio(2.0, 51)
    data = bytes(64) + video.data[64:] if damage == "header-zeroed" else b"this is not a video file"
    request = Request(
        f"Watch {PLACEHOLDER['video']}.",
        videos=[dataclasses.replace(video, data=data)],
        audio_in_video=True,
    )
    try:
        processed = make_model().process_request(request)
    except (NotImplementedByTarget, NeedsCuda):
        raise  # a skip with the target's reason, not an outcome
    except Exception as e:
        assert_clear_error(e, VIDEO_FILE_FIELDS)
        return
    kinds = [item.modality for item in processed.items]
    raise AssertionError(
        f"a {damage} file with audio_in_video: expected a clear error naming one of "
        f"{list(VIDEO_FILE_FIELDS)}; the request succeeded with items {kinds}, the track "
        "dropped without an error"
    )
