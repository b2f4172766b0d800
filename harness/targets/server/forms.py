"""The requests the server checks and the load run send: each catalogue form the API can carry,
on the engine's default variant (its 128-wide language model), with a video file where the
catalogue's request holds decoded frames (the API carries files)."""

from __future__ import annotations

import dataclasses
import functools

from harness.inputs.catalogue import FORMS_BY_NAME
from harness.inputs.media import video_file_without_audio
from harness.inputs.requests import Request
from harness.targets.engine.target import engine_spec

#: A prompt with no media.
TEXT = Request("The quiet cat sat on a mat while rain fell over the hills, and then it slept.")
#: A video file's request.
VIDEO_FILE = Request("What happens in <video>?", videos=[video_file_without_audio(3)])
#: The forms a chat request carries: the catalogue's, and ``text`` and ``video-file``.
API_FORMS = ("text", "images-pil", "video-file", "audios", "mixed", "video-audio-in-video")


@functools.cache
def api_request(form: str) -> Request:
    """``form``'s request as sent to the server: :data:`TEXT`, :data:`VIDEO_FILE`, or the
    catalogue's (``mixed`` with :data:`VIDEO_FILE`'s video in place of its frames)."""
    if form == "text":
        return TEXT
    if form == "video-file":
        return VIDEO_FILE
    if form not in FORMS_BY_NAME:
        raise ValueError(
            f"api_request: form: expected 'text', 'video-file' or a catalogue form, got {form!r}"
        )
    catalogued = FORMS_BY_NAME[form]
    request = catalogued.request_for(engine_spec(catalogued.spec))
    if form == "mixed":
        request = dataclasses.replace(request, videos=list(VIDEO_FILE.videos))
    return request
