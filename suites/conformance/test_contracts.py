"""Typed input contracts at run time, on every target: valid inputs are accepted (stacked and
list forms where the contract allows both); a wrong rank, a wrong literal dimension, a
symbolic dimension that disagrees across fields, or a wrong dtype is rejected with an error
naming the field (the processor's keyword or the schema's field name)."""

from __future__ import annotations

import pytest
import torch

from harness.oracles.assertions import raises_clear_error

pytestmark = pytest.mark.concern("contracts")

H = 32


def valid(kind: str) -> dict[str, object]:
    g = torch.Generator().manual_seed(0)
    if kind == "image_embeds":
        return {"image_embeds": torch.randn(2, 3, H, generator=g)}
    if kind == "video_embeds":
        return {"video_embeds": torch.randn(2, 5, H, generator=g)}
    if kind == "pixel_values":
        return {
            "pixel_values_flat": torch.randn(3, 3, 32, 32, generator=g),
            "image_num_patches": torch.tensor([2, 1]),
        }
    if kind == "pixel_values_videos":
        return {
            "pixel_values_flat_video": torch.randn(5, 3, 32, 32, generator=g),
            "video_num_patches": torch.tensor([2, 3]),
            "frames_indices": torch.arange(5),
            "frame_duration_ms": torch.tensor([500, 500]),
        }
    return {
        "input_audio_features": torch.randn(3, 12, 8, generator=g),
        "feature_attention_mask": torch.ones(3, 12, dtype=torch.bool),
        "audio_num_clips": [1, 2],
    }


KINDS = ("image_embeds", "video_embeds", "pixel_values", "pixel_values_videos", "audio_features")


@pytest.mark.parametrize("kind", KINDS)
def test_valid_inputs_are_accepted(target, kind):
    target.validate_contract(kind, valid(kind), H)


@pytest.mark.parametrize("kind", ["image_embeds", "video_embeds"])
def test_list_form_is_accepted(target, kind):
    stacked = valid(kind)[kind]
    target.validate_contract(kind, {kind: list(stacked.unbind(0))}, H)


def changed(kind: str, **updates: object) -> dict[str, object]:
    return {**valid(kind), **updates}


INVALID = {
    "embeds-rank": (
        "image_embeds",
        changed("image_embeds", image_embeds=torch.zeros(3, H)),
        ["image_embeds"],
    ),
    "embeds-list-item-rank": (
        "video_embeds",
        changed("video_embeds", video_embeds=[torch.zeros(2, 3, H)]),
        ["video_embeds"],
    ),
    "pixels-channels": (
        "pixel_values",
        changed("pixel_values", pixel_values_flat=torch.zeros(3, 4, 32, 32)),
        ["pixel_values_flat"],
    ),
    "pixels-rank": (
        "pixel_values",
        changed("pixel_values", pixel_values_flat=torch.zeros(3, 32, 32)),
        ["pixel_values_flat"],
    ),
    "num-patches-rank": (
        "pixel_values",
        changed("pixel_values", image_num_patches=torch.tensor([[2, 1]])),
        ["image_num_patches", "num_patches"],
    ),
    "frames-indices-disagree": (
        "pixel_values_videos",
        changed("pixel_values_videos", frames_indices=torch.arange(4)),
        ["frames_indices", "pixel_values_flat"],
    ),
    "audio-mask-length": (
        "audio_features",
        changed("audio_features", feature_attention_mask=torch.ones(3, 11, dtype=torch.bool)),
        ["feature_attention_mask"],
    ),
    "audio-features-rank": (
        "audio_features",
        changed("audio_features", input_audio_features=torch.zeros(3, 12)),
        ["input_audio_features"],
    ),
    "pixels-dtype": (
        "pixel_values",
        changed("pixel_values", pixel_values_flat=torch.zeros(3, 3, 32, 32, dtype=torch.int64)),
        ["pixel_values_flat"],
    ),
}


@pytest.mark.parametrize("case", INVALID)
def test_invalid_inputs_are_rejected_naming_the_field(target, case):
    kind, fields, names = INVALID[case]
    with raises_clear_error(*names):
        target.validate_contract(kind, fields, H)
