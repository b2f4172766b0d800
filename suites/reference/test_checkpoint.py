"""The checkpoint folder form in the reference: the top-level ``config.json`` round trip, the
checkpoint naming (the inverse of the loader), folder loading, streamed loading, and loader
errors that name the checkpoint's tensor."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from harness.checkpoints.weight_streams import reusing_buffers
from reference_impl import presets
from reference_impl.checkpoint import (
    checkpoint_state_dict,
    load_folder,
    load_vl_checkpoint,
    vl_config_from_hf_dict,
    vl_config_to_hf_dict,
)
from reference_impl.errors import ConfigError
from reference_impl.model import NanoNemotronVLForConditionalGeneration
from reference_impl.radio import RadioConfig
from reference_impl.tokenizer import VOCAB_SIZE, shared_tokenizer
from reference_impl.weights import WeightLoadError


def small(name: str = "nemotron_3_nano_omni", **changes):
    """A tiny preset whose RADIO is a real model-name size (a checkpoint names RADIO's size by
    its model name), shrunk to 1 layer only in the model built from it."""
    config = presets.tiny_vl_config(getattr(presets, name)(), VOCAB_SIZE)
    vision = RadioConfig.from_model_name(
        "vit_small_patch16_224",
        image_size=32,
        patch_size=8,
        cpe_max_size=64,
        video_temporal_patch_size=config.video_temporal_patch_size,
    )
    return dataclasses.replace(config, vision_config=vision, vit_hidden_size=384, **changes)


@pytest.mark.parametrize("name", ["nemotron_nano_12b_v2_vl", "nemotron_3_nano_omni"])
def test_config_json_round_trip(name):
    config = small(name)
    data = json.loads(json.dumps(vl_config_to_hf_dict(config)))
    assert data["model_type"] == data["architectures"][0] == "NemotronH_Nano_VL_V2"
    assert data["vision_config"]["args"]["model"] == "vit_small_patch16_224"
    assert ("sound_config" in data) == (config.sound_config is not None)
    assert ("min_num_patches" in data["vision_config"]["args"]) == config.dynamic_resolution
    back = vl_config_from_hf_dict(data)
    for field in (
        "text_config",
        "vision_config",
        "sound_config",
        "dynamic_resolution",
        "video_temporal_patch_size",
        "force_image_size",
        "projector_hidden_size",
        "num_image_token",
    ):
        assert getattr(back, field) == getattr(config, field), field


def test_config_json_names_a_bad_field():
    data = vl_config_to_hf_dict(small())
    data["vision_config"]["args"] = {}
    with pytest.raises(ConfigError, match=r"vision_config\.args"):
        vl_config_from_hf_dict(data)
    with pytest.raises(ConfigError, match="text_config"):
        vl_config_from_hf_dict({"vision_config": {}})


def test_the_vision_epsilons_and_video_target_round_trip_to_their_own_fields():
    """vision_config.layer_norm_eps is the vision_final_layernorm's epsilon (vLLM reads it for
    that norm only); RADIO's blocks take theirs from timm's args (1e-6 when unnamed); a video
    patch target and the aspect switch stay in vision_config."""
    config = small(video_target_num_patches=36, video_maintain_aspect_ratio=True)
    assert config.vision_config is not None
    vision = dataclasses.replace(config.vision_config, layer_norm_eps=1e-5, final_layernorm_eps=0.5)
    data = json.loads(
        json.dumps(vl_config_to_hf_dict(dataclasses.replace(config, vision_config=vision)))
    )
    assert data["vision_config"]["layer_norm_eps"] == 0.5
    assert data["vision_config"]["args"]["layer_norm_eps"] == 1e-5
    assert data["vision_config"]["video_target_num_patches"] == 36
    assert data["vision_config"]["video_maintain_aspect_ratio"] is True
    back = vl_config_from_hf_dict(data)
    assert back.vision_config is not None
    assert (back.vision_config.layer_norm_eps, back.vision_config.final_layernorm_eps) == (
        1e-5,
        0.5,
    )
    assert (back.video_target_num_patches, back.video_maintain_aspect_ratio) == (36, True)
    default = vl_config_to_hf_dict(small())
    assert "layer_norm_eps" not in default["vision_config"]["args"]  # timm's default, unwritten
    assert "video_target_num_patches" not in default["vision_config"]


def test_a_video_target_in_pixels_is_its_square_grid_of_patches():
    """video_target_img_size: ceil(side / patch)^2 patches; with video_target_num_patches too,
    refused naming both (vLLM raises a ValueError for the same)."""
    data = vl_config_to_hf_dict(small())
    patch = data["vision_config"]["patch_size"]
    data["vision_config"]["video_target_img_size"] = 5 * patch - 1
    assert vl_config_from_hf_dict(data).video_target_num_patches == 25
    data["vision_config"]["video_target_num_patches"] = 36
    with pytest.raises(ConfigError, match="video_target_num_patches / video_target_img_size"):
        vl_config_from_hf_dict(data)
    del data["vision_config"]["video_target_img_size"]
    data["vision_config"]["video_target_num_patches"] = 0
    with pytest.raises(ConfigError, match=r"video_target_num_patches': expected a positive int"):
        vl_config_from_hf_dict(data)


def test_a_tower_not_of_its_model_names_size_has_no_checkpoint_form():
    config = presets.tiny_vl_config(presets.nemotron_3_nano_omni(), VOCAB_SIZE)  # a 32-wide RADIO
    with pytest.raises(ConfigError, match="vision_config"):
        vl_config_to_hf_dict(config)


def build(config, seed):
    torch.manual_seed(seed)
    return NanoNemotronVLForConditionalGeneration(config, shared_tokenizer()).eval()


def one_layer_radio():
    config = small()
    return dataclasses.replace(
        config, vision_config=dataclasses.replace(config.vision_config, num_layers=1)
    )


def test_checkpoint_names_are_the_loaders_inverse():
    config = one_layer_radio()
    first, second = build(config, 0), build(config, 1)
    weights = checkpoint_state_dict(first)
    assert any(".mixer.experts.0.up_proj.weight" in name for name in weights)  # one by one
    assert any(".q_proj." in name for name in weights)
    assert not any(".qkv_proj." in n for n in weights)
    load_vl_checkpoint(second, weights)
    for (name, a), (_, b) in zip(
        first.state_dict().items(), second.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_streamed_weights_from_reused_buffers_load_like_a_mapping():
    config = one_layer_radio()
    first, second = build(config, 0), build(config, 1)
    load_vl_checkpoint(second, reusing_buffers(checkpoint_state_dict(first)))
    for (name, a), (_, b) in zip(
        first.state_dict().items(), second.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(
    "name",
    [
        "language_model.backbone.norm_f.weight",
        "mlp1.1.weight",
        "sound_projection.linear1.weight",
        "language_model.backbone.layers.1.mixer.experts.1.down_proj.weight",
    ],
)
def test_a_missing_tensor_is_named_by_its_checkpoint_name(name):
    config = one_layer_radio()
    model = build(config, 0)
    weights = checkpoint_state_dict(model)
    assert name in weights
    del weights[name]
    with pytest.raises(WeightLoadError, match=rf"missing: .*{name.replace('.', '[.]')}"):
        load_vl_checkpoint(build(config, 1), weights)


def test_load_folder_reads_the_harness_folder(tmp_path):
    from harness.checkpoints.spec import ModelSpec
    from harness.checkpoints.writer import write_checkpoint

    spec = ModelSpec(audio=False)
    folder = write_checkpoint(spec, tmp_path / "ckpt")
    model = load_folder(folder, shared_tokenizer())
    assert model.config == spec.vl_config()
    assert model.multimodal.sound_encoder is None
