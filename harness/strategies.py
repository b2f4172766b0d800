"""Hypothesis strategies for multimodal inputs."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st

from harness import inputs
from harness.checkpoint import ModelSpec
from harness.inputs import InputGroup

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
class Request:
    """One ``embed_multimodal`` call: groups in key order, plus ignorable extras."""

    groups: list[InputGroup]
    extras: dict[str, object] = field(default_factory=dict)

    @property
    def kwargs(self) -> dict[str, object]:
        kwargs = inputs.combine(self.groups)
        for key, value in self.extras.items():
            kwargs.setdefault(key, value)
        return kwargs

    @property
    def num_items(self) -> int:
        return sum(g.num_items for g in self.groups)


@st.composite
def input_groups(draw: st.DrawFn, spec: ModelSpec, form: str, *, ragged: bool = True) -> InputGroup:
    """One group of ``form``; embedding lists have per-item row counts when ``ragged``."""
    seed = draw(st.integers(0, 2**16))
    n = draw(st.integers(1, 3))
    if form in ("image_embeds", "video_embeds"):
        stacked = draw(st.booleans())
        rows = (
            [draw(st.integers(1, 4))] * n
            if stacked or not ragged
            else draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
        )
        return inputs.embeddings(spec, form, rows, stacked=stacked, seed=seed)
    if form == "pixel_values_flat":
        tiles = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
        return inputs.image_pixels(spec, tiles, seed=seed)
    if form == "pixel_values_flat_video":
        frames = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
        return inputs.video_pixels(spec, frames, seed=seed)
    if form == "input_audio_features":
        clips = draw(st.lists(st.integers(1, 2), min_size=n, max_size=n))
        return inputs.audio_features(spec, clips, seed=seed)
    raise ValueError(f"form: expected one of {inputs.FORMS}, got {form!r}")


@st.composite
def requests(
    draw: st.DrawFn, spec: ModelSpec, *, ragged: bool = True, none_keys: bool = True
) -> Request:
    """A random subset of modalities, each in one form, in random key order, with unrelated
    keyword arguments mixed in; with ``ragged``, embedding lists of per-item row counts; with
    ``none_keys``, None-valued keys of absent forms."""
    choices = {
        "images": st.sampled_from(["image_embeds", "pixel_values_flat"]),
        "videos": st.sampled_from(["video_embeds", "pixel_values_flat_video"]),
    }
    if spec.audio:
        choices["audios"] = st.just("input_audio_features")
    present = draw(st.lists(st.sampled_from(sorted(choices)), unique=True, max_size=3))
    forms = [draw(choices[m]) for m in present]
    groups = [draw(input_groups(spec, form, ragged=ragged)) for form in forms]
    absent = [f for f in ("image_embeds", "video_embeds") if f not in forms and none_keys]
    extras: dict[str, object] = {}
    for key in draw(st.lists(st.sampled_from(absent), unique=True)) if absent else []:
        extras[key] = None
    for key in draw(st.lists(st.sampled_from(sorted(UNRELATED_KWARGS)), unique=True)):
        extras[key] = UNRELATED_KWARGS[key]
    return Request(groups=groups, extras=extras)
