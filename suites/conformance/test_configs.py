"""Minimal-layer configs and the Mamba state helpers (vLLM PR #38655), on every target.

- The shrunk V2 VL and Omni V3 configs keep every layer kind, shrink the towers, and build and
  run (reference only: a vLLM forward pass needs GPU kernels).
- The target's state-shape and dtype helpers, called on an engine config that holds a live
  parameter and refuses to be deep-copied, give the reference's shapes for each shrunk config
  (vLLM: a real ``VllmConfig`` built offline, its ``hf_config`` the stand-in VL config).
"""

from __future__ import annotations

import pytest
import torch

from reference_impl import presets
from reference_impl.dummy import mamba_state_dtypes, mamba_state_shapes
from reference_impl.tokenizer import VOCAB_SIZE

PRESETS = ("nemotron_nano_12b_v2_vl", "nemotron_3_nano_omni")


def shrunk(name: str):
    return presets.tiny(getattr(presets, name)(), VOCAB_SIZE)


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("tp_size", [1, 2])
def test_state_shapes_match_the_reference_without_deep_copies(target, name, tp_size):
    text = shrunk(name).text_config
    state = target.mamba_state(text, tp_size)
    conv, ssm = mamba_state_shapes(text, tp_size)
    assert state.conv_shape == conv
    assert state.ssm_shape == ssm
    assert state.dtypes == mamba_state_dtypes(torch.bfloat16, "auto", "float32")


@pytest.mark.parametrize("name", PRESETS)
def test_shrunk_configs_build_and_run(target, name):
    if not target.name.startswith("reference"):
        pytest.skip("reference-only: a vLLM forward pass needs GPU kernels absent on CPU")
    from reference_impl.model import NanoNemotronVLForConditionalGeneration
    from reference_impl.processor import NanoNemotronVLProcessor
    from reference_impl.tokenizer import shared_tokenizer

    big, small = getattr(presets, name)(), shrunk(name)
    assert set(small.text_config.hybrid_override_pattern) == set(
        big.text_config.hybrid_override_pattern
    )
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
