"""NemotronH config forms and validation; the minimal-layer builder; the state helpers."""

from __future__ import annotations

import copy
import dataclasses
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from reference_impl import presets
from reference_impl.config import NemotronHConfig, VLConfig
from reference_impl.errors import ConfigError
from reference_impl.mamba_state import (
    mamba_state_dtype_from_config,
    mamba_state_dtypes,
    mamba_state_shape_from_config,
    mamba_state_shapes,
)
from reference_impl.presets import tiny_text_config
from reference_impl.shrink import minimal_pattern, minimal_text_config, minimal_vl_config


def config_12b(**fields):
    """Nemotron Nano 12B v2's language model (the preset), with ``fields`` changed."""
    return dataclasses.replace(presets.nemotron_nano_12b_v2_vl().text_config, **fields)


def test_round_trip_checkpoint_form():
    config = tiny_text_config("M*-E", intermediate_size=[40])
    data = config.to_hf_dict()
    assert data["hybrid_override_pattern"] == "M*-E"
    assert data["num_hidden_layers"] == 4
    assert NemotronHConfig.from_hf_dict(data) == config


def test_reads_constructor_aliases():
    data = tiny_text_config().to_hf_dict()
    for alias, name in (
        ("mamba_n_groups", "n_groups"),
        ("mamba_d_conv", "conv_kernel"),
        ("mamba_chunk_size", "chunk_size"),
    ):
        data[alias] = data.pop(name)
    assert NemotronHConfig.from_hf_dict(data) == tiny_text_config()


def test_reads_the_transformers_form():
    from transformers.models.nemotron_h import NemotronHConfig as HFConfig

    config = tiny_text_config("M*-E")
    hf_dict = HFConfig(**config.to_transformers_dict()).to_dict()
    assert "hybrid_override_pattern" not in hf_dict
    assert hf_dict["layers_block_type"] == ["linear_attention", "full_attention", "mlp", "moe"]
    assert NemotronHConfig.from_hf_dict(hf_dict) == config


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"hybrid_override_pattern": "M*X"}, "hybrid_override_pattern"),
        ({"hybrid_override_pattern": ""}, "hybrid_override_pattern"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"n_groups": 3}, "n_groups"),
        ({"intermediate_size": (8, 8)}, "intermediate_size"),
        ({"n_group": 3}, "n_group"),
        ({"topk_group": 3}, "topk_group"),
        ({"num_experts_per_tok": 5}, "num_experts_per_tok"),
        ({"hidden_size": 0}, "hidden_size"),
    ],
)
def test_validation_names_the_field(change, field):
    with pytest.raises(ConfigError, match=f"'{field}'"):
        tiny_text_config("M*-E", **change)


def test_pattern_length_must_match_num_hidden_layers():
    data = tiny_text_config("M*").to_hf_dict() | {"num_hidden_layers": 3}
    with pytest.raises(ConfigError, match=r"num_hidden_layers.*expected the pattern's length 2"):
        NemotronHConfig.from_hf_dict(data)


def test_both_pattern_forms_must_agree():
    data = tiny_text_config("M*").to_hf_dict() | {"layers_block_type": ["mamba", "mlp"]}
    with pytest.raises(ConfigError, match="as layers_block_type says"):
        NemotronHConfig.from_hf_dict(data)


# --- the minimal-layer builder -------------------------------------------------------------


def test_minimal_pattern_keeps_every_kind_in_order():
    assert minimal_pattern(presets.PATTERN_12B) == "M-*"
    assert minimal_pattern("EM*M-E*", 1) == "EM*-"
    assert minimal_pattern("MMM*MM*", 2) == "MM**"


def test_minimal_text_config_shrinks_and_keeps_kinds():
    big = config_12b()
    small = minimal_text_config(big)
    assert set(small.hybrid_override_pattern) == set(big.hybrid_override_pattern)
    assert small.num_hidden_layers == 3
    assert big.num_hidden_layers == 62  # the original is untouched


def test_minimal_text_config_shrinks_moe():
    big = tiny_text_config(
        "MEE*", n_routed_experts=16, n_group=4, topk_group=2, num_experts_per_tok=4
    )
    small = minimal_text_config(big)
    assert small.n_routed_experts == 8  # 2 per group
    assert small.num_experts_per_tok == 2
    assert small.hybrid_override_pattern == "ME*"


def test_per_layer_widths_follow_the_kept_layers():
    big = tiny_text_config("-M-*-", intermediate_size=[8, 16, 24])
    small = minimal_text_config(big)
    assert small.hybrid_override_pattern == "-M*"
    assert small.intermediate_size == (8,)


def test_vllm_registry_override():
    """vLLM's registry override for both Nano-Nemotron entries: 2 layers, "M*"."""
    small = minimal_text_config(
        config_12b(), overrides={"num_hidden_layers": 2, "hybrid_override_pattern": "M*"}
    )
    assert small.hybrid_override_pattern == "M*"
    assert small.num_hidden_layers == 2


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"num_hidden_layers": 3, "hybrid_override_pattern": "M*"}, "num_hidden_layers"),
        ({"hybrid_override_pattern": "M*Q"}, "hybrid_override_pattern"),
        ({"not_a_field": 1}, "not_a_field"),
        ({"n_groups": 7}, "n_groups"),
    ],
)
def test_inconsistent_overrides_are_rejected(overrides, message):
    with pytest.raises(ConfigError, match=message):
        minimal_text_config(config_12b(), overrides=overrides)


def vl_config():
    text = tiny_text_config("MM*-E")
    return VLConfig(
        hidden_size=text.hidden_size,
        vocab_size=text.vocab_size,
        vit_hidden_size=8,
        projector_hidden_size=16,
        force_image_size=32,
        patch_size=8,
        text_config=text,
    )


def test_nested_text_config_overrides_apply_to_the_nested_config():
    small = minimal_vl_config(
        vl_config(),
        overrides={
            "text_config": {
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "hybrid_override_pattern": "M*",
            },
            "projector_hidden_size": 12,
        },
    )
    assert isinstance(small.text_config, NemotronHConfig)  # not a plain dict merged in
    assert small.text_config.hidden_size == 64
    assert small.hidden_size == 64  # the wrapper follows its language model
    assert small.text_config.hybrid_override_pattern == "M*"
    assert small.text_config.ssm_state_size == 8  # untouched fields kept
    assert small.projector_hidden_size == 12


def test_a_sound_tower_s_layer_count_override_is_taken_not_dropped():
    """Parakeet's layer count is a field of its config (the language model's follows its
    pattern): an override of it shrinks to that many layers, not the minimal one."""
    omni = presets.nemotron_3_nano_omni()
    one = minimal_vl_config(omni).sound_config
    two = minimal_vl_config(omni, overrides={"sound_config": {"num_hidden_layers": 2}}).sound_config
    assert one is not None
    assert two is not None
    assert one.num_hidden_layers == 1
    assert two.num_hidden_layers == 2


def test_nested_overrides_must_be_a_mapping_of_fields():
    with pytest.raises(ConfigError, match="text_config overrides"):
        minimal_vl_config(vl_config(), overrides={"text_config": "M*"})
    with pytest.raises(ConfigError, match="bogus"):
        minimal_vl_config(vl_config(), overrides={"text_config": {"bogus": 1}})


def test_wrapper_and_language_model_must_agree():
    with pytest.raises(ConfigError, match="hidden_size"):
        dataclasses.replace(vl_config(), hidden_size=33)


# --- state helpers -------------------------------------------------------------------------


def test_state_shapes_12b():
    conv, ssm = mamba_state_shapes(config_12b())
    assert conv == (128 * 80 + 2 * 8 * 128, 3)
    assert ssm == (128, 80, 128)


def test_state_shapes_with_tensor_parallelism_replicate_groups():
    conv, ssm = mamba_state_shapes(config_12b(n_groups=1), tp_size=4)
    # 1 group is replicated to 4 so each shard holds the group its heads use.
    assert conv == ((128 * 80 + 2 * 4 * 128) // 4, 3)
    assert ssm == (32, 80, 128)


def test_state_dtypes():
    assert mamba_state_dtypes(torch.bfloat16) == (torch.bfloat16, torch.bfloat16)
    assert mamba_state_dtypes(torch.bfloat16, "auto", "float32") == (torch.bfloat16, torch.float32)
    with pytest.raises(ConfigError, match="mamba_ssm_cache_dtype"):
        mamba_state_dtypes(torch.bfloat16, "auto", "fp4")


class LiveParameter(nn.Parameter):
    """A parameter a serving engine holds live: deep-copying it fails, as #38655's did."""

    def __deepcopy__(self, memo):
        raise RuntimeError("deepcopy of a live parameter")


class EngineConfig:
    """A stand-in for a serving engine's config: live layers inside, deep copy forbidden."""

    def __init__(self, text_config):
        hf = SimpleNamespace(text_config=text_config)
        self.model_config = SimpleNamespace(hf_config=hf, dtype=torch.bfloat16)
        self.parallel_config = SimpleNamespace(tensor_parallel_size=2)
        self.cache_config = SimpleNamespace(
            mamba_cache_dtype="auto", mamba_ssm_cache_dtype="float32"
        )
        self.compilation_config = SimpleNamespace(
            static_forward_context={"layer": LiveParameter(torch.zeros(2))}
        )
        self.num_speculative_tokens = 1

    def __deepcopy__(self, memo):
        raise AssertionError("the whole engine config must never be deep-copied")


def test_state_helpers_never_copy_the_live_config():
    engine = EngineConfig(config_12b())
    with pytest.raises(RuntimeError, match="live parameter"):
        copy.deepcopy(engine.compilation_config)  # the trap is armed
    conv, ssm = mamba_state_shape_from_config(engine)
    assert conv == ((128 * 80 + 2 * 8 * 128) // 2, 3 + 1)
    assert ssm == (64, 80, 128)
    assert mamba_state_dtype_from_config(engine) == (torch.bfloat16, torch.float32)


def test_nested_tower_overrides_apply_to_the_tower_configs():
    omni = presets.nemotron_3_nano_omni()
    small = minimal_vl_config(
        omni,
        overrides={
            "vision_config": {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "mlp_size": 128},
            "sound_config": {"hidden_size": 48, "num_attention_heads": 4},
        },
    )
    assert (small.vision_config.num_layers, small.vision_config.hidden_size) == (2, 64)
    assert small.vit_hidden_size == 64  # the wrapper follows its tower
    assert small.sound_config.hidden_size == 48
    assert small.sound_config.num_hidden_layers == 1  # shrunk by default
    assert small.sound_config.llm_hidden_size == small.hidden_size
    with pytest.raises(ConfigError, match="vision_config overrides"):
        minimal_vl_config(omni, overrides={"vision_config": {"depth": 2}})
    with pytest.raises(ConfigError, match="sound_config overrides"):
        minimal_vl_config(
            presets.nemotron_nano_12b_v2_vl(), overrides={"sound_config": {"hidden_size": 8}}
        )
