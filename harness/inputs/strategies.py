"""Hypothesis strategies for multimodal inputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st

from harness.checkpoints.serving import ServingConfig
from harness.checkpoints.spec import ModelSpec
from harness.inputs import model_kwargs
from harness.inputs.media import (
    audio_clip,
    audio_samples,
    embedding_rows,
    pil_image,
    sampled_clip,
)
from harness.inputs.model_kwargs import InputGroup
from harness.inputs.requests import (
    AUDIO_SAMPLE_RATE,
    PLACEHOLDER,
    AudioClip,
    Items,
    Request,
    VideoClip,
)

#: Keyword arguments a model's ``embed_multimodal`` receives that name no multimodal input.
UNRELATED_KWARGS: dict[str, object] = {
    "input_ids": None,
    "positions": None,
    "intermediate_tensors": None,
    "is_multimodal": None,
    "request_id": "req-0",
    "mm_hashes": ["abc"],
}


@dataclass
class EmbedCall:
    """The keyword arguments of one ``embed_multimodal`` call: groups in key order, plus
    ignorable extras."""

    groups: list[InputGroup]
    extras: dict[str, object] = field(default_factory=dict)

    @property
    def kwargs(self) -> dict[str, object]:
        kwargs = model_kwargs.combine(self.groups)
        for key, value in self.extras.items():
            kwargs.setdefault(key, value)
        return kwargs

    @property
    def num_items(self) -> int:
        return sum(g.num_items for g in self.groups)


@st.composite
def input_groups(draw: st.DrawFn, spec: ModelSpec, key: str, *, ragged: bool = True) -> InputGroup:
    """One group under routing ``key``; embedding lists have per-item row counts when
    ``ragged``."""
    seed = draw(st.integers(0, 2**16))
    n = draw(st.integers(1, 3))
    if key in ("image_embeds", "video_embeds"):
        stacked = draw(st.booleans())
        rows = (
            [draw(st.integers(1, 4))] * n
            if stacked or not ragged
            else draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
        )
        return model_kwargs.embeddings(spec, key, rows, stacked=stacked, seed=seed)
    if key == "pixel_values_flat":
        tiles = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
        return model_kwargs.image_pixels(spec, tiles, seed=seed)
    if key == "pixel_values_flat_video":
        frames = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
        return model_kwargs.video_pixels(spec, frames, seed=seed)
    if key == "input_audio_features":
        clips = draw(st.lists(st.integers(1, 2), min_size=n, max_size=n))
        return model_kwargs.audio_features(spec, clips, seed=seed)
    raise ValueError(f"key: expected one of {model_kwargs.ROUTING_KEYS}, got {key!r}")


@st.composite
def embed_calls(
    draw: st.DrawFn, spec: ModelSpec, *, ragged: bool = True, none_keys: bool = True
) -> EmbedCall:
    """A random subset of modalities, each under one routing key, in random key order, with
    unrelated keyword arguments mixed in; with ``ragged``, embedding lists of per-item row
    counts; with ``none_keys``, None-valued keys of absent ones."""
    choices = {
        "images": st.sampled_from(["image_embeds", "pixel_values_flat"]),
        "videos": st.sampled_from(["video_embeds", "pixel_values_flat_video"]),
    }
    if spec.audio:
        choices["audios"] = st.just("input_audio_features")
    present = draw(st.lists(st.sampled_from(sorted(choices)), unique=True, max_size=3))
    keys = [draw(choices[m]) for m in present]
    groups = [draw(input_groups(spec, key, ragged=ragged)) for key in keys]
    absent = [k for k in ("image_embeds", "video_embeds") if k not in keys and none_keys]
    extras: dict[str, object] = {}
    for key in draw(st.lists(st.sampled_from(absent), unique=True)) if absent else []:
        extras[key] = None
    for key in draw(st.lists(st.sampled_from(sorted(UNRELATED_KWARGS)), unique=True)):
        extras[key] = UNRELATED_KWARGS[key]
    return EmbedCall(groups=groups, extras=extras)


# ---------------------------------------------------------------------------------------------
# Requests at the engine's boundary (harness.inputs.requests): what a user may send, within bounds.


@dataclass(frozen=True)
class RequestBounds:
    """The sizes user requests are drawn from (inclusive).

    Wide enough to reach every tiling and clipping path (a 2,048 px side is 32 static tiles
    wide; 70 s of audio is three 30 s clips), small enough that one request embeds in about a
    second on a CPU with the tiny checkpoints.
    """

    images: tuple[int, int] = (1, 4)
    image_side_px: tuple[int, int] = (8, 2048)
    videos: tuple[int, int] = (1, 2)
    video_frames: tuple[int, int] = (1, 16)
    video_side_px: tuple[int, int] = (8, 128)
    #: Source frame rates as decoders report them: the NTSC rates (23.976, 29.97), whose frame
    #: duration is no whole number of milliseconds, beside 2 (a sampled clip), 25 and 60.
    video_fps: tuple[float, ...] = (2.0, 24000 / 1001, 25.0, 30000 / 1001, 60.0)
    video_seconds: tuple[float, float] = (0.5, 120.0)
    audios: tuple[int, int] = (1, 2)
    audio_seconds: tuple[float, float] = (0.1, 70.0)
    embedding_items: tuple[int, int] = (1, 5)
    embedding_rows: tuple[int, int] = (1, 64)


REQUEST_BOUNDS = RequestBounds()


@st.composite
def _media(draw: st.DrawFn, modality: str, bounds: RequestBounds) -> list[Any]:
    """One modality's media items: PIL images, video clips or mono audio."""
    seed = draw(st.integers(0, 2**16))
    if modality == "image":
        n = draw(st.integers(*bounds.images))
        side = st.integers(*bounds.image_side_px)
        return [pil_image(draw(side), draw(side), seed + i) for i in range(n)]
    if modality == "video":
        n = draw(st.integers(*bounds.videos))
        return [draw(_video(bounds, seed + i)) for i in range(n)]
    n = draw(st.integers(*bounds.audios))
    seconds = st.floats(*bounds.audio_seconds, allow_nan=False)
    return [audio_clip(draw(seconds), seed + i) for i in range(n)]


@st.composite
def _video(draw: st.DrawFn, bounds: RequestBounds, seed: int) -> VideoClip:
    """A clip as a video loader samples it (:func:`sampled_clip`): frames of any shape (portrait,
    landscape, square), an odd or even count, at a drawn source frame rate and length."""
    side = st.integers(*bounds.video_side_px)
    return sampled_clip(
        draw(st.integers(*bounds.video_frames)),
        draw(side),
        draw(side),
        seed,
        fps=draw(st.sampled_from(bounds.video_fps)),
        seconds=draw(st.floats(*bounds.video_seconds, allow_nan=False)),
    )


@st.composite
def video_requests(
    draw: st.DrawFn, spec: ModelSpec, bounds: RequestBounds = REQUEST_BOUNDS
) -> Request:
    """A request with one or two videos (:func:`_video`), their placeholders among words."""
    seed = draw(st.integers(0, 2**16))
    videos = [draw(_video(bounds, seed + i)) for i in range(draw(st.integers(*bounds.videos)))]
    return Request(_prompt(draw, {"video": videos}), videos=videos)


@st.composite
def image_near_a_threshold(draw: st.DrawFn, spec: ModelSpec) -> tuple[int, int]:
    """An image's ``(height, width)`` where the tilers' choices change: a few pixels either side
    of a grid of whole tiles (``cols x rows`` of ``image_size`` with ``cols * rows`` up to the
    tile limit and one past it, which moves the static tiler's aspect-ratio pick and the dynamic
    tiler's patch grid), or an extreme aspect ratio (up to 1:64) with a short side of 1 to
    20 px (under a patch's 16 px, as a thumbnail or a one-pixel line is)."""
    side = spec.image_size
    if draw(st.booleans()):
        cols = draw(st.integers(1, spec.max_num_tiles + 1))
        rows = draw(st.integers(1, max(1, (spec.max_num_tiles + 1) // cols)))
        nudge = st.integers(-3, 3)
        return max(8, rows * side + draw(nudge)), max(8, cols * side + draw(nudge))
    short, ratio = draw(st.integers(1, 20)), draw(st.integers(1, 64))
    return (short, short * ratio) if draw(st.booleans()) else (short * ratio, short)


@st.composite
def image_requests(draw: st.DrawFn, spec: ModelSpec, filler: int = 0) -> Request:
    """A request with one to three images, each near a tiling threshold
    (:func:`image_near_a_threshold`), their placeholders among words, after up to ``filler``
    characters of text (a long prompt leaves the images less of the context)."""
    seed = draw(st.integers(0, 2**16))
    sizes = draw(st.lists(image_near_a_threshold(spec), min_size=1, max_size=3))
    images = [pil_image(h, w, seed + i) for i, (h, w) in enumerate(sizes)]
    text = "Describe these pictures. " * (filler // 25 + 1)
    padding = text[: draw(st.integers(0, filler))]
    return Request(padding + _prompt(draw, {"image": images}), images=images)


#: Where vLLM cuts long audio into clips (30 s at 16 kHz), and how many samples one audio token
#: spans (hop 160, three stride-2 convolutions: 8 mel frames).
AUDIO_CLIP_SAMPLES = 30 * AUDIO_SAMPLE_RATE
AUDIO_TOKEN_SAMPLES = 160 * 8
#: The rates a drawn audio is recorded at: the model's, and rates users record at that vLLM's
#: loader resamples from (telephony, CD and its half, video and its half).
AUDIO_RATES = (AUDIO_SAMPLE_RATE, 8000, 22050, 44100, 48000, 24000)


@st.composite
def audio_requests(draw: st.DrawFn, spec: ModelSpec) -> Request:
    """A request with one or two audios whose lengths sit around a clip boundary (1 or 2 clips
    of 30 s) within about one audio token's samples either side, so that both the split into
    clips and the last clip's token count change within the range drawn; recorded at the
    model's 16 kHz or at a rate the engine resamples from (:data:`AUDIO_RATES`)."""
    seed = draw(st.integers(0, 2**16))
    lengths = draw(
        st.lists(
            st.builds(
                lambda clips, offset: clips * AUDIO_CLIP_SAMPLES + offset,
                st.integers(1, 2),
                st.integers(-AUDIO_TOKEN_SAMPLES - 20, AUDIO_TOKEN_SAMPLES + 20),
            ),
            min_size=1,
            max_size=2,
        )
    )
    rate = draw(st.sampled_from(AUDIO_RATES))
    audios: list[object] = [
        audio_samples(n, seed + i)
        if rate == AUDIO_SAMPLE_RATE
        # As long at ``rate``, so that resampled it sits about as near the boundary.
        else AudioClip(audio_samples(n * rate // AUDIO_SAMPLE_RATE, seed + i), rate)
        for i, n in enumerate(lengths)
    ]
    return Request(_prompt(draw, {"audio": audios}), audios=audios)


@st.composite
def _embeddings(draw: st.DrawFn, spec: ModelSpec, bounds: RequestBounds) -> Items:
    """Precomputed embeddings: a stacked ``[n, f, h]`` tensor, or a list of ``[f_i, h]``."""
    seed = draw(st.integers(0, 2**16))
    n = draw(st.integers(*bounds.embedding_items))
    rows = draw(st.lists(st.integers(*bounds.embedding_rows), min_size=n, max_size=n))
    if draw(st.booleans()):  # stacked: one row count for every item
        return torch.stack([embedding_rows(rows[0], spec.hidden_size, seed + i) for i in range(n)])
    return [embedding_rows(r, spec.hidden_size, seed + i) for i, r in enumerate(rows)]


def _prompt(draw: st.DrawFn, items: dict[str, Items]) -> str:
    """Every item's placeholder, in a random interleaving, with a few words between them."""
    placeholders = [PLACEHOLDER[m] for m, given in items.items() for _ in range(len(given))]
    order = draw(st.permutations(placeholders))
    words = st.sampled_from(["Look", "at", "this:", "and", "then", "hear", "the", "end."])
    text = [" ".join(draw(st.lists(words, max_size=3))) for _ in range(len(order) + 1)]
    return text[0] + "".join(f" {p} {t}" for p, t in zip(order, text[1:], strict=True))


@st.composite
def media_requests(
    draw: st.DrawFn, spec: ModelSpec, bounds: RequestBounds = REQUEST_BOUNDS
) -> Request:
    """A request with media of one to three modalities (audio only when the checkpoint has
    it) within ``bounds``, their placeholders interleaved at random."""
    modalities = ["image", "video", "audio"] if spec.audio else ["image", "video"]
    present = draw(st.lists(st.sampled_from(modalities), min_size=1, max_size=3, unique=True))
    items: dict[str, Items] = {m: draw(_media(m, bounds)) for m in present}
    return Request(
        _prompt(draw, items),
        images=items.get("image", []),
        videos=items.get("video", []),
        audios=items.get("audio", []),
    )


@st.composite
def embedding_requests(
    draw: st.DrawFn, spec: ModelSpec, modality: str, bounds: RequestBounds = REQUEST_BOUNDS
) -> Request:
    """A request with precomputed embeddings of ``modality`` (``image`` or ``video``) within
    ``bounds``."""
    if modality not in ("image", "video"):
        raise ValueError(f"modality: expected 'image' or 'video', got {modality!r}")
    given = draw(_embeddings(spec, bounds))
    prompt = _prompt(draw, {modality: given})
    if modality == "image":
        return Request(prompt, images=given)
    return Request(prompt, videos=given)


# ---------------------------------------------------------------------------------------------
# Serving configurations

#: The request-level serving options drawn with a request (harness.checkpoints.serving), from few
#: values so that the models they need are built once: ``--max-model-len`` changes the built model.
SERVED_CONTEXTS = (None, 96, 256, 1024)
SERVED_TILE_LIMITS = (None, 1, 2, 6)
SERVED_ITEM_LIMITS = (None, 0, 1, 2)


@st.composite
def serving_configs(draw: st.DrawFn) -> ServingConfig:
    """A serving configuration a user may start the engine with, over the options that act on
    a media request: the context, per-modality item limits, the processor's tile limit, and
    embeddings accepted or not. ``--dtype`` is not drawn: test_serving_dtype runs every served
    dtype through every tower path."""
    limits = {
        modality: limit
        for modality in ("image", "video", "audio")
        if (limit := draw(st.sampled_from(SERVED_ITEM_LIMITS), label=f"limit {modality}"))
        is not None
    }
    tiles = draw(st.sampled_from(SERVED_TILE_LIMITS), label="max_num_tiles")
    return ServingConfig(
        enable_mm_embeds=draw(st.booleans(), label="enable_mm_embeds"),
        limit_mm_per_prompt=limits,
        max_model_len=draw(st.sampled_from(SERVED_CONTEXTS), label="max_model_len"),
        mm_processor_kwargs={} if tiles is None else {"max_num_tiles": tiles},
    )
