"""Minimal-layer configs and the Mamba state helpers (vLLM PR #38655), on every target.

- The target's state-shape and dtype helpers, called on an engine config that holds a live
  parameter and refuses to be deep-copied, give the reference's shapes for the shrunk V2 VL and
  Omni V3 language models (vLLM: the checkpoint folder's real ``VllmConfig``, the language
  model's fields set through ``hf_overrides``).
- Minimal-layer overrides build: applied the way the target applies them (vLLM: its own
  ``hf_overrides`` on ``ModelConfig``, nested ``text_config`` included; the reference: its
  minimal-config builder), the built language model has exactly the overridden layers and the
  towers still embed a tile into its placeholder rows.
- The shrunk presets keep every layer kind and run end to end (reference only: a vLLM forward
  pass of the language model needs GPU kernels).
"""

from __future__ import annotations

import pytest
import torch

from harness.checkpoints.spec import ModelSpec
from reference_impl import presets
from reference_impl.tokenizer import VOCAB_SIZE

PRESETS = ("nemotron_nano_12b_v2_vl", "nemotron_3_nano_omni")


def shrunk(name: str):
    return presets.tiny_vl_config(getattr(presets, name)(), VOCAB_SIZE)


@pytest.mark.concern("state")
@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("tp_size", [1, 2])
def test_state_shapes_match_the_reference_without_deep_copies(target, name, tp_size):
    """The architecture's Mamba2 state per sequence and layer, written here: the conv window
    ``(conv_dim / tp, K - 1)`` with ``conv_dim = heads * head_dim + 2 * groups * N`` and the SSM
    state ``(heads / tp, head_dim, N)``; the conv state in the model's dtype (bf16), the SSM
    state in the configured ``mamba_ssm_cache_dtype`` (fp32)."""
    text = shrunk(name).text_config
    heads, head_dim = text.mamba_num_heads, text.mamba_head_dim
    groups, state_size = text.n_groups, text.ssm_state_size
    assert groups % tp_size == 0, "no extra groups for this tensor-parallel size"
    conv_dim = heads * head_dim + 2 * groups * state_size
    state = target.mamba_state(text, tp_size)
    assert state.conv_shape == (conv_dim // tp_size, text.conv_kernel - 1)
    assert state.ssm_shape == (heads // tp_size, head_dim, state_size)
    assert state.dtypes == (torch.bfloat16, torch.float32)


#: Minimal-layer overrides, each in the form a user writes it, with the pattern it must build.
MINIMAL_OVERRIDES = {
    # vLLM's own test registry for NemotronH_Nano_VL_V2 (checkpoint form).
    "registry-pattern": (
        {"text_config": {"num_hidden_layers": 2, "hybrid_override_pattern": "M*"}},
        "M*",
    ),
    # The same in transformers 5's form of NemotronHConfig.
    "layers-block-type": (
        {"text_config": {"layers_block_type": ["linear_attention", "full_attention"]}},
        "M*",
    ),
    # An attention layer between two Mamba layers, and an MLP.
    "three-kinds": (
        {"text_config": {"layers_block_type": ["linear_attention", "mlp", "full_attention"]}},
        "M-*",
    ),
}


@pytest.mark.concern("minimal")
@pytest.mark.parametrize("case", MINIMAL_OVERRIDES)
def test_minimal_overrides_build(target, case):
    overrides, pattern = MINIMAL_OVERRIDES[case]
    spec = ModelSpec()
    built = target.build_minimal(spec, overrides)
    assert built.layer_kinds == pattern
    assert built.vision_rows == spec.tokens_per_tile


def preset_overrides(name: str) -> tuple[dict[str, object], str]:
    """The shrunk preset's language model as a nested ``text_config`` override in
    transformers 5's form, and the pattern it must build."""
    text = shrunk(name).text_config
    fields = {k: v for k, v in text.to_transformers_dict().items() if k != "model_type"}
    return {"text_config": fields}, text.hybrid_override_pattern


@pytest.mark.concern("minimal")
@pytest.mark.parametrize("name", PRESETS)
def test_shrunk_presets_build_with_every_layer_kind(target, name):
    """The shrunk presets keep every layer kind of the full models and build in the target
    (vLLM: its constructor under ``hf_overrides``, dummy weights, the towers run)."""
    big = getattr(presets, name)()
    overrides, pattern = preset_overrides(name)
    assert set(pattern) == set(big.text_config.hybrid_override_pattern)
    spec = ModelSpec()
    built = target.build_minimal(spec, overrides)  # vLLM's MoE layer needs CUDA: skips on CPU
    assert built.layer_kinds == pattern
    assert built.vision_rows == spec.tokens_per_tile


@pytest.mark.concern("minimal")
@pytest.mark.parametrize("name", PRESETS)
def test_shrunk_presets_run_end_to_end(target, name):
    if not target.name.startswith("reference"):
        pytest.skip("reference-only: a vLLM forward pass of the language model needs GPU kernels")
    from reference_impl.model import NanoNemotronVLForConditionalGeneration
    from reference_impl.processor import NanoNemotronVLProcessor
    from reference_impl.tokenizer import shared_tokenizer

    big, small = getattr(presets, name)(), shrunk(name)
    assert small.vision_config.num_layers < big.vision_config.num_layers
    torch.manual_seed(0)
    model = NanoNemotronVLForConditionalGeneration(small, shared_tokenizer()).eval()
    prompt = NanoNemotronVLProcessor(small, shared_tokenizer())(
        "<image>", images=[torch.zeros(32, 32, 3, dtype=torch.uint8)]
    )
    with torch.no_grad():
        logits = model(
            torch.tensor(prompt.input_ids),
            torch.tensor(prompt.is_multimodal),
            prompt.placeholders,
            **prompt.mm_kwargs,
        )
    assert logits.shape == (len(prompt.input_ids), VOCAB_SIZE)
    assert torch.isfinite(logits).all()
