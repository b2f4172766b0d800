"""Request shapes: what a request (on a checkpoint variant) must have for a known vLLM bug to
reach it, each a named predicate.

A property check draws requests, and the covering array serves the catalogue on other variants;
either may meet a bug another check is pinned for. The bug's message alone does not say it is
that bug (``int() argument ... 'NoneType'``, ``division by zero`` and a bare ``assert`` are
raised by many): a known deviation excuses such a drawn example only where its entry names the
shape of the requests it reaches (``drawn = "NAME"`` in ``fixtures/deviations/``) and the
drawn request has that shape (:func:`harness.jobs.deviations.explained_by`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harness.checkpoints.spec import ModelSpec
from harness.inputs.requests import PLACEHOLDER, Request


@dataclass(frozen=True)
class RequestShape:
    """A named predicate on a request and the variant it is served on."""

    name: str
    meaning: str
    holds: Callable[[Request, ModelSpec], bool]


def _has_media(request: Request) -> bool:
    return any(
        request.num_items(m) and request.embeddings(m) is None for m in ("image", "video", "audio")
    ) or (request.audio_in_video and bool(request.videos))


def _text_besides_placeholders(request: Request) -> bool:
    text = request.prompt
    for mark in PLACEHOLDER.values():
        text = text.replace(mark, "")
    return bool(text.strip())


REQUEST_SHAPES: dict[str, RequestShape] = {
    shape.name: shape
    for shape in (
        RequestShape(
            "image-embeddings",
            "precomputed image embeddings (stacked or a list)",
            lambda r, s: r.embeddings("image") is not None,
        ),
        RequestShape(
            "audio-in-video",
            "a video file's own audio track as an audio item (use_audio_in_video)",
            lambda r, s: r.audio_in_video and bool(r.videos),
        ),
        RequestShape(
            "media-on-a-float32-checkpoint",
            "media (not embeddings) on a checkpoint saved in float32, served at --dtype auto",
            lambda r, s: s.checkpoint_dtype == "float32" and _has_media(r),
        ),
        RequestShape(
            "images-after-text-at-dynamic-resolution",
            "images at dynamic resolution in a prompt with text besides the placeholders",
            lambda r, s: (
                s.dynamic_resolution
                and r.num_items("image") > 0
                and r.embeddings("image") is None
                and _text_besides_placeholders(r)
            ),
        ),
    )
}


def request_has_shape(name: str, request: Request, spec: ModelSpec) -> bool:
    """Whether ``request`` on ``spec`` has the shape ``name`` (one of :data:`REQUEST_SHAPES`)."""
    if name not in REQUEST_SHAPES:
        raise ValueError(
            f"request shapes: name: expected one of {sorted(REQUEST_SHAPES)}, got {name!r}"
        )
    return REQUEST_SHAPES[name].holds(request, spec)
