"""The caches the engine sizes for the model, under the cache options a user sets:
``--mamba-ssm-cache-dtype``, ``--kv-cache-dtype`` and ``--enable-prefix-caching``.

Expected values come from the architecture (``../shared/design/architecture.md``) and the
folder's config, never from the target:

- a Mamba2 layer's state: the convolution window ``[conv_dim, K - 1]`` with
  ``conv_dim = H * P + 2 * G * N`` (``H`` heads of ``P``, ``G`` groups of state size ``N``,
  ``K`` the conv kernel), in the served dtype; the SSM state ``[H, P, N]`` in
  ``--mamba-ssm-cache-dtype``, ``auto`` meaning the config's ``mamba_ssm_cache_dtype``
  (float32 for NemotronH: vLLM PR #39032 made the VL model follow it; before, its state was
  bf16). Its page: the two states' bytes;
- an attention layer's KV cache: keys and values of ``num_key_value_heads`` heads of
  ``head_dim``, in the served dtype (``auto``) or ``--kv-cache-dtype`` (fp8: one byte);
- a hybrid model's pages must be equal, so the attention block is the smallest multiple of the
  platform's block alignment whose page holds one Mamba state, and the Mamba page is padded to
  that page: ``block = a * ceil(mamba_page / (a * attention_bytes_per_token))`` with
  ``a = max(kernel block multiple, default block)`` (vLLM's platforms: CUDA's default attention
  backends 16 and 16, 16 and 64 from vLLM 0.34.0, the CPU's 32 and 128),
  ``padded = block * attention_bytes_per_token``;
- prefix caching on: one Mamba state per block ("align"); off: one per request (the context).

vLLM issue #24280 is the class of surprise this pins: a hybrid model's attention block of 672
tokens, forced by the Mamba page, which an attention kernel limited to 128 could not serve.
The reference has no engine caches: these checks do not apply to it.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness.checkpoints.serving import ServingConfig
from harness.checkpoints.spec import ModelSpec
from harness.release_environments import installed_release, release_numbers

pytestmark = pytest.mark.concern("model")

BYTES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}
#: (kernel block multiple, default block) of each platform's attention backend. vLLM 0.34.0
#: raised the default block (``CacheConfig.DEFAULT_BLOCK_SIZE``) from 16 to 64 tokens, which
#: CUDA's Triton and FlashAttention backends take as the alignment; the CPU's is its own, 128.
ALIGNMENT = {"engine": (32, 128), "cuda": (16, 16)}
ALIGNMENT_FROM_0_34 = {"engine": (32, 128), "cuda": (16, 64)}


def alignment(platform: str) -> tuple[int, int]:
    """The platform's (kernel block multiple, default block) on the installed vLLM release."""
    release = release_numbers(installed_release() or "0")
    return (ALIGNMENT_FROM_0_34 if release >= (0, 34) else ALIGNMENT)[platform]


SPEC = ModelSpec()

CONFIGS = [
    ServingConfig(enable_prefix_caching=True),
    ServingConfig(enable_prefix_caching=False),
    ServingConfig(enable_prefix_caching=True, mamba_ssm_cache_dtype="float16"),
    ServingConfig(enable_prefix_caching=True, mamba_ssm_cache_dtype="bfloat16"),
    ServingConfig(enable_prefix_caching=True, dtype="float32"),
]
#: Configurations checked for a CUDA user only: fp8 KV caches need a GPU's attention backend.
CUDA_ONLY = [ServingConfig(enable_prefix_caching=True, kv_cache_dtype="fp8")]


def expected_layout(serving: ServingConfig, platform: str) -> dict[str, object]:
    text = SPEC.vl_config().text_config
    served = serving.torch_dtype() or torch.bfloat16  # the folder is saved in bf16
    ssm = {
        "auto": torch.float32,  # NemotronH's config default: mamba_ssm_cache_dtype float32
        "float32": torch.float32,
        "float16": torch.float16,
        "bfloat16": torch.bfloat16,
    }[serving.mamba_ssm_cache_dtype]
    heads, head_dim, groups, state = (
        text.mamba_num_heads,
        text.mamba_head_dim,
        text.n_groups,
        text.ssm_state_size,
    )
    conv_dim = heads * head_dim + 2 * groups * state
    window = text.conv_kernel - 1
    mamba_page = conv_dim * window * BYTES[served] + heads * head_dim * state * BYTES[ssm]
    kv_bytes = 1 if serving.kv_cache_dtype.startswith("fp8") else BYTES[served]
    per_token = 2 * text.num_key_value_heads * text.head_dim * kv_bytes
    multiple, default = alignment(platform)
    align = max(multiple, default)
    block = align * math.ceil(mamba_page / (align * per_token))
    prefix = serving.enable_prefix_caching
    return {
        "conv_shape": (conv_dim, window),
        "ssm_shape": (heads, head_dim, state),
        "dtypes": (served, ssm),
        "mamba_page": mamba_page,
        "attention": (text.num_key_value_heads, text.head_dim, per_token),
        "block_size": block,
        "padded": block * per_token,
        "mamba_block_size": block if prefix else SPEC.max_model_len,
        "mode": "align" if prefix else "none",
    }


def check_blocks(layout, expected) -> None:
    assert layout.block_size == expected["block_size"], (
        f"attention block {layout.block_size} tokens, the architecture's {expected['block_size']}"
    )
    assert layout.mamba_page_size_padded == expected["padded"], (
        f"Mamba page padded to {layout.mamba_page_size_padded} bytes, expected {expected['padded']}"
    )
    assert (layout.mamba_cache_mode, layout.mamba_block_size) == (
        expected["mode"],
        expected["mamba_block_size"],
    ), "Mamba states per block"


@pytest.mark.parametrize("serving", CONFIGS, ids=lambda s: s.name)
def test_the_engine_sizes_the_caches_from_the_state_shapes(target, serving):
    layout = target.cache_layout(SPEC, serving, "engine")
    expected = expected_layout(serving, "engine")
    layers = SPEC.vl_config().text_config.hybrid_override_pattern
    assert len(layout.mamba) == layers.count("M"), "one Mamba state per Mamba layer"
    assert len(layout.attention) == layers.count("*"), "one KV cache per attention layer"
    for shapes, dtypes, page in layout.mamba:
        conv, ssm = (tuple(s) for s in shapes)
        # vLLM may keep the conv state (window, channels): compare as (channels, window).
        if conv != expected["conv_shape"] and tuple(reversed(conv)) == expected["conv_shape"]:
            conv = expected["conv_shape"]
        assert (conv, ssm) == (expected["conv_shape"], expected["ssm_shape"]), "state shapes"
        assert tuple(dtypes) == expected["dtypes"], (
            f"state dtypes {dtypes}, expected {expected['dtypes']} for {serving.name}"
        )
        assert page == expected["mamba_page"], (
            f"Mamba page {page}, expected {expected['mamba_page']}"
        )
    for heads, head_size, dtype, per_token in layout.attention:
        assert (heads, head_size, per_token) == expected["attention"], "KV cache per token"
        assert dtype == expected["dtypes"][0], f"KV cache in {dtype}"
    check_blocks(layout, expected)


@pytest.mark.parametrize("serving", CONFIGS + CUDA_ONLY, ids=lambda s: s.name)
def test_a_cuda_engine_sizes_the_blocks_from_the_state_shapes(target, serving):
    check_blocks(target.cache_layout(SPEC, serving, "cuda"), expected_layout(serving, "cuda"))
