"""The reference input layer: contracts reject bad input with an error naming the field."""

from __future__ import annotations

import pytest
import torch

from reference_impl.config import VLConfig
from reference_impl.errors import ConfigError
from reference_impl.inputs import (
    AudioFeatureInputs,
    ImageEmbeddingInputs,
    ImagePixelDynamicInputs,
    ImagePixelInputs,
    InputValidationError,
    VideoPixelInputs,
)


def test_stacked_and_list_embeddings_are_both_accepted():
    ImageEmbeddingInputs(torch.zeros(2, 3, 8)).validate(hidden_size=8)
    ImageEmbeddingInputs([torch.zeros(3, 8), torch.zeros(5, 8)]).validate(hidden_size=8)


@pytest.mark.parametrize(
    ("data", "field", "expected"),
    [
        (torch.zeros(2, 3), "image_embeds", "rank 3"),
        (torch.zeros(2, 3, 9), "image_embeds.shape[2]", "h=8 as bound by the model config"),
        ([torch.zeros(3, 8), torch.zeros(3, 9)], "image_embeds[1].shape[1]", "h=8"),
        ([torch.zeros(3, 8, 1)], "image_embeds[0]", "rank 2"),
        (torch.zeros(2, 3, 8, dtype=torch.int64), "image_embeds", "a floating-point dtype"),
        ([], "image_embeds", "at least one item"),
    ],
)
def test_bad_embeddings_name_the_field(data, field, expected):
    with pytest.raises(InputValidationError) as info:
        ImageEmbeddingInputs(data).validate(hidden_size=8)
    assert info.value.field == field
    assert expected in str(info.value)


def test_tiles_must_sum_to_num_patches():
    with pytest.raises(InputValidationError, match=r"sum\(image_num_patches\): expected t=3"):
        ImagePixelInputs(torch.zeros(3, 3, 16, 16), [1, 1]).validate(tile_size=16)


def test_tiles_must_have_the_tile_size():
    with pytest.raises(InputValidationError, match=r"pixel_values_flat.shape\[2\]: expected s=32"):
        ImagePixelInputs(torch.zeros(2, 3, 16, 16), [2]).validate(tile_size=32)


def test_tiles_need_three_channels():
    with pytest.raises(InputValidationError, match=r"pixel_values_flat.shape\[1\]: expected 3"):
        ImagePixelInputs(torch.zeros(2, 1, 16, 16), [2]).validate()


def test_dynamic_token_counts_are_checked():
    inputs = ImagePixelDynamicInputs([torch.zeros(3, 32, 16)], [(32, 16)], [9])
    with pytest.raises(InputValidationError, match=r"num_tokens_per_image\[0\]: expected 2"):
        inputs.validate(patch_size=8, shuffle_factor=2)


def test_dynamic_sizes_must_match_the_images():
    inputs = ImagePixelDynamicInputs([torch.zeros(3, 32, 16)], [(16, 32)], [2])
    with pytest.raises(InputValidationError, match=r"pixel_values_flat\[0\].shape\[1\]"):
        inputs.validate(patch_size=8, shuffle_factor=2)


def test_video_frames_indices_must_cover_every_frame():
    video = VideoPixelInputs(torch.zeros(3, 3, 16, 16), [3], [0, 1], [500])
    with pytest.raises(InputValidationError, match=r"frames_indices: expected v=3"):
        video.validate(patch_size=8, shuffle_factor=2)


def test_videos_of_two_frame_sizes_come_one_tensor_each():
    """Videos resized keeping their aspect ratios: one [f, 3, H, W] tensor per video, each as
    many frames as its count."""
    tall, wide = torch.zeros(2, 3, 32, 16), torch.zeros(1, 3, 16, 32)
    VideoPixelInputs([tall, wide], [2, 1], [0, 1, 0], [500, 500]).validate(8, 2)
    with pytest.raises(
        InputValidationError, match=r"pixel_values_flat_video\[1\]\.shape\[0\]: expected "
    ):
        VideoPixelInputs([tall, wide], [2, 2], [0, 1, 0, 1], [500, 500]).validate(8, 2)
    with pytest.raises(InputValidationError, match=r"frames_indices: expected v=3"):
        VideoPixelInputs([tall, wide], [2, 1], [0, 1], [500, 500]).validate(8, 2)


def test_audio_mask_must_match_features():
    audio = AudioFeatureInputs(torch.zeros(2, 10, 8), torch.ones(2, 9, dtype=torch.bool), [2])
    with pytest.raises(
        InputValidationError, match=r"feature_attention_mask.shape\[1\]: expected l=10"
    ):
        audio.validate()


def test_audio_clips_must_sum_to_the_clip_count():
    audio = AudioFeatureInputs(torch.zeros(3, 10, 8), torch.ones(3, 10, dtype=torch.bool), [1, 1])
    with pytest.raises(InputValidationError, match=r"sum\(audio_num_clips\): expected c=3"):
        audio.validate()


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"hidden_size": 0}, "hidden_size"),
        ({"downsample_ratio": 0.3}, "downsample_ratio"),
        ({"ps_version": "v3"}, "ps_version"),
        ({"force_image_size": 20}, "force_image_size"),
        ({"force_image_size": 24}, "force_image_size"),  # 3 x 3 patches: not shuffle-divisible
    ],
)
def test_config_errors_name_the_field(fields, name):
    base = {
        "hidden_size": 8,
        "vocab_size": 10,
        "vit_hidden_size": 4,
        "projector_hidden_size": 4,
        "force_image_size": 32,
        "patch_size": 8,
    }
    with pytest.raises(ConfigError) as info:
        VLConfig(**{**base, **fields})
    assert info.value.field_name == name


def test_config_derives_tokens_per_tile():
    config = VLConfig(
        hidden_size=8,
        vocab_size=10,
        vit_hidden_size=4,
        projector_hidden_size=4,
        force_image_size=512,
        patch_size=16,
    )
    assert config.num_image_token == 256  # the brief's 12B value: (512/16)^2 / 4
    assert config.connector_in_size == 16
