"""Builders of valid multimodal keyword arguments for a target's model.

Each builder returns an :class:`InputGroup`: the keyword arguments of one modality under one
routing key, as vLLM's batching hands them to ``embed_multimodal``, plus what a conforming
implementation must produce from them (how many items; for embeddings, the exact tensors). Values
are deterministic functions of ``seed``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from harness.checkpoints.spec import ModelSpec

#: The routing key of each builder's input (the keyword ``embed_multimodal`` routes by).
ROUTING_KEYS = (
    "image_embeds",
    "pixel_values_flat",
    "video_embeds",
    "pixel_values_flat_video",
    "input_audio_features",
)
#: The modality each routing key routes to.
MODALITY_OF = {
    "image_embeds": "images",
    "pixel_values_flat": "images",
    "video_embeds": "videos",
    "pixel_values_flat_video": "videos",
    "input_audio_features": "audios",
}


@dataclass
class InputGroup:
    """One modality's inputs under one routing key.

    Attributes:
        key: the routing key (``"image_embeds"``, ``"pixel_values_flat"``, ...).
        kwargs: the keyword arguments, in the order a processor would emit them.
        num_items: items a conforming ``embed_multimodal`` returns for them.
        expected: for precomputed embeddings, the exact tensors to come back (else empty).
        uses_encoder: whether producing the outputs takes the vision or audio encoder.
    """

    key: str
    kwargs: dict[str, object]
    num_items: int
    expected: list[torch.Tensor] = field(default_factory=list)

    @property
    def modality(self) -> str:
        return MODALITY_OF[self.key]

    @property
    def uses_encoder(self) -> bool:
        return self.key not in ("image_embeds", "video_embeds")


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def embeddings(
    spec: ModelSpec,
    key: str,
    rows: Sequence[int],
    *,
    stacked: bool,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> InputGroup:
    """Precomputed ``image_embeds`` / ``video_embeds``: a stacked ``[n, f, h]`` tensor (all rows
    equal) or a list of ``[f_i, h]`` tensors."""
    if key not in ("image_embeds", "video_embeds"):
        raise ValueError(f"key: expected 'image_embeds' or 'video_embeds', got {key!r}")
    g = _generator(seed)
    if stacked:
        if len(set(rows)) != 1:
            raise ValueError(f"rows: a stacked tensor needs equal row counts, got {list(rows)}")
        data = torch.randn(len(rows), rows[0], spec.hidden_size, generator=g).to(dtype)
        items = list(data.unbind(0))
        return InputGroup(key, {key: data}, len(rows), [t.clone() for t in items])
    tensors = [torch.randn(r, spec.hidden_size, generator=g).to(dtype) for r in rows]
    return InputGroup(key, {key: tensors}, len(rows), [t.clone() for t in tensors])


def image_pixels(spec: ModelSpec, tiles_per_image: Sequence[int], seed: int = 0) -> InputGroup:
    """Static tiles: ``pixel_values_flat [sum tiles, 3, S, S]`` and ``image_num_patches``."""
    g = _generator(seed)
    s = spec.image_size
    pixels = torch.randn(sum(tiles_per_image), 3, s, s, generator=g)
    kwargs: dict[str, object] = {
        "pixel_values_flat": pixels,
        "image_num_patches": torch.tensor(list(tiles_per_image), dtype=torch.int64),
    }
    return InputGroup("pixel_values_flat", kwargs, len(tiles_per_image))


def video_pixels(
    spec: ModelSpec, frames_per_video: Sequence[int], *, fps: float = 2.0, seed: int = 0
) -> InputGroup:
    """Frames of every video (``S x S``), frames per video, frame indices and durations."""
    g = _generator(seed)
    s = spec.image_size
    total = sum(frames_per_video)
    kwargs: dict[str, object] = {
        "pixel_values_flat_video": torch.randn(total, 3, s, s, generator=g),
        "video_num_patches": torch.tensor(list(frames_per_video), dtype=torch.int64),
        "frames_indices": torch.cat([torch.arange(n, dtype=torch.int64) for n in frames_per_video]),
        "frame_duration_ms": torch.tensor(
            [int(1000 / fps)] * len(frames_per_video), dtype=torch.int64
        ),
    }
    return InputGroup("pixel_values_flat_video", kwargs, len(frames_per_video))


def audio_features(
    spec: ModelSpec, clips_per_audio: Sequence[int], *, frames: int = 12, seed: int = 0
) -> InputGroup:
    """Mel features of every clip ``[c, l, m]``, a bool mask with varied valid lengths, and the
    clips per audio."""
    g = _generator(seed)
    clips = sum(clips_per_audio)
    features = torch.randn(clips, frames, spec.num_mel_bins, generator=g)
    valid = torch.randint(1, frames + 1, (clips,), generator=g)
    mask = torch.arange(frames)[None, :] < valid[:, None]
    kwargs: dict[str, object] = {
        "input_audio_features": features,
        "feature_attention_mask": mask,
        "audio_num_clips": list(clips_per_audio),
    }
    return InputGroup("input_audio_features", kwargs, len(clips_per_audio))


def combine(groups: Sequence[InputGroup]) -> dict[str, object]:
    """One call's keyword arguments from several groups, in group order; keys must not clash."""
    kwargs: dict[str, object] = {}
    for group in groups:
        clash = set(kwargs) & set(group.kwargs)
        if clash:
            raise ValueError(f"groups: keys {sorted(clash)} given by two groups")
        kwargs.update(group.kwargs)
    return kwargs


def expected_modality_order(groups: Sequence[InputGroup]) -> list[str]:
    """Modalities in the order of their first group (groups of one modality are one modality)."""
    order: list[str] = []
    for group in groups:
        if group.modality not in order:
            order.append(group.modality)
    return order
