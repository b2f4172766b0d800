"""Reference LoRA for the language model only: per-token adapter slots through a fixed-length
mapping, merged-weight numerics, the base-layer fallback for encoder-internal tokens, and the
LM-only boundary."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.targets.reference.mutant import REFERENCE_MUTANTS
from reference_impl import presets
from reference_impl.lora import (
    LoRAAdapter,
    LoRAError,
    apply_lora,
    merged_copy,
    warn_video_tokens_without_delta,
)
from reference_impl.model import NanoNemotronVLForConditionalGeneration
from reference_impl.nemotron_h import NemotronHForCausalLM
from reference_impl.presets import tiny_text_config
from reference_impl.processor import NanoNemotronVLProcessor, Video
from reference_impl.tokenizer import VOCAB_SIZE, shared_tokenizer

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj", "out_proj", "up_proj", "down_proj")


def random_adapter(
    model: NemotronHForCausalLM, name: str, rank: int, seed: int, embeddings: bool = True
) -> LoRAAdapter:
    """An adapter on every targetable layer (q/k/v as the checkpoint names them)."""
    gen = torch.Generator().manual_seed(seed)
    cfg = model.config
    weights = {}
    q, kv = (
        cfg.num_attention_heads * cfg.attention_head_dim,
        (cfg.num_key_value_heads * cfg.attention_head_dim),
    )
    for module_name, module in model.named_modules():
        leaf = module_name.rpartition(".")[2]
        if isinstance(module, torch.nn.Linear) and leaf in (*TARGETS, "qkv_proj"):
            if leaf == "qkv_proj":
                prefix = module_name.rpartition(".")[0]
                for part, out in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
                    weights[f"{prefix}.{part}"] = (
                        torch.randn(rank, module.in_features, generator=gen) * 0.1,
                        torch.randn(out, rank, generator=gen) * 0.1,
                    )
            else:
                weights[module_name] = (
                    torch.randn(rank, module.in_features, generator=gen) * 0.1,
                    torch.randn(module.out_features, rank, generator=gen) * 0.1,
                )
    if embeddings:
        weights["model.embed_tokens"] = (
            torch.randn(rank, cfg.vocab_size, generator=gen) * 0.1,
            torch.randn(cfg.hidden_size, rank, generator=gen) * 0.1,
        )
    return LoRAAdapter(name, rank, alpha=2.0 * rank, weights=weights)


@pytest.fixture
def lm():
    torch.manual_seed(0)
    return NemotronHForCausalLM(tiny_text_config("M*-E")).eval()


def test_lora_forward_equals_merged_weights(lm):
    """Three requests in one batch (adapter 0, adapter 1, none): each sequence's logits equal
    those of the model with its adapter merged (fp32, <= 1e-5)."""
    adapters = [random_adapter(lm, "a", 4, 1), random_adapter(lm, "b", 2, 2)]
    reference = [None, None]
    lora = apply_lora(lm, max_loras=2, max_rank=4, max_num_batched_tokens=64)
    for i, adapter in enumerate(adapters):
        lora.load(adapter)
        reference[i] = merged_copy(lora, adapter)
    ids = torch.randint(0, lm.config.vocab_size, (3, 9), generator=torch.Generator().manual_seed(3))
    slots = [0] * 9 + [1] * 9 + [-1] * 9  # row-major: one request per sequence
    lora.context.set(slots)
    with torch.no_grad():
        logits = lora.model(ids)
        for slot, expected_model in enumerate(reference):
            expected = expected_model(ids[slot : slot + 1])[0]
            assert (logits[slot] - expected).abs().max() <= 1e-5
        # The request without an adapter gets the base model.
        lora.context.set([-1] * 9)
        base = lora.model(ids[2:3])[0]
    assert (logits[2] - base).abs().max() <= 1e-5
    assert lora.adapters == {"a": 0, "b": 1}


def test_adapters_change_the_output(lm):
    lora = apply_lora(lm, max_loras=1, max_rank=4, max_num_batched_tokens=16)
    ids = torch.arange(8)[None]
    lora.context.set([-1] * 8)
    with torch.no_grad():
        base = lora.model(ids)
    lora.load(random_adapter(lm, "a", 4, 1))
    lora.context.set([0] * 8)
    with torch.no_grad():
        assert (lora.model(ids) - base).abs().max() > 1e-3


def test_mapping_is_fixed_length(lm):
    lora = apply_lora(lm, max_loras=1, max_rank=2, max_num_batched_tokens=8)
    with pytest.raises(LoRAError, match="at most max_num_batched_tokens=8 tokens, got 9"):
        lora.context.set([0] * 9)
    lora.context.set([0] * 8)
    with pytest.raises(LoRAError, match="12 tokens but the mapping holds 8"):
        lora.model(torch.zeros(1, 12, dtype=torch.int64))


@pytest.mark.parametrize(
    ("module", "message"),
    [
        ("vision_model.radio_model.blocks.0.attn.qkv", "language model only"),
        ("mlp1.1", "language model only"),
        ("sound_encoder.encoder.layers.0.feed_forward1.linear1", "language model only"),
        ("model.layers.0.mixer.not_a_layer", "expected a LoRA target of this model"),
    ],
)
def test_adapters_outside_the_language_model_are_rejected(lm, module, message):
    lora = apply_lora(lm, max_loras=1, max_rank=2, max_num_batched_tokens=8)
    adapter = LoRAAdapter("bad", 2, 2.0, {module: (torch.zeros(2, 4), torch.zeros(4, 2))})
    with pytest.raises(LoRAError, match=message):
        lora.load(adapter)


def test_bad_shapes_and_ranks_are_named(lm):
    lora = apply_lora(lm, max_loras=1, max_rank=2, max_num_batched_tokens=8)
    wrong = LoRAAdapter(
        "w", 2, 2.0, {"model.layers.0.mixer.out_proj": (torch.zeros(2, 3), torch.zeros(3, 2))}
    )
    with pytest.raises(LoRAError, match=r"w: model.layers.0.mixer.out_proj: expected A"):
        lora.load(wrong)
    with pytest.raises(LoRAError, match="r: expected a rank of at most max_lora_rank=2, got 4"):
        lora.load(random_adapter(lm, "big", 4, 0))


def test_metadata_of_the_vl_class_equals_the_lms():
    for name in (
        "packed_modules_mapping",
        "embedding_modules",
        "lora_skip_prefixes",
        "is_non_gated_moe",
    ):
        assert getattr(NanoNemotronVLForConditionalGeneration, name) == getattr(
            NemotronHForCausalLM, name
        ), name


def vl_with_lora(max_num_batched_tokens: int):
    config = presets.tiny_vl_config(presets.nemotron_nano_12b_v2_vl(), VOCAB_SIZE)
    torch.manual_seed(0)
    model = NanoNemotronVLForConditionalGeneration(config, shared_tokenizer()).eval()
    lora = apply_lora(
        model.language_model, max_loras=1, max_rank=2, max_num_batched_tokens=max_num_batched_tokens
    )
    # The wrapper shares the LM's embedding: after wrapping, point it at the LoRA wrapper, as
    # vLLM's VL class reaches the LM's (wrapped) embed_tokens.
    model.multimodal.embed_tokens = model.language_model.model.embed_tokens
    lora.load(random_adapter(model.language_model, "a", 2, 5))
    return model, lora, NanoNemotronVLProcessor(config, shared_tokenizer())


def test_video_marker_tokens_use_the_base_layer_beyond_the_mapping_length():
    """The prompt's tokens (placeholders included) have mapping entries; the video's marker
    tokens are made inside the model, outnumber nothing in the mapping, and must be embedded
    with the base layer: the request works."""
    probe = vl_with_lora(4096)[2]
    video = Video(torch.zeros(4, 32, 32, 3, dtype=torch.uint8))
    prompt = probe("<video>?", videos=[video])
    model, lora, proc = vl_with_lora(len(prompt.input_ids))
    prompt = proc("<video>?", videos=[video])
    lora.context.set([0] * len(prompt.input_ids))
    replacement = prompt.placeholders[0].length
    assert replacement > 0
    with torch.no_grad():
        logits = model(
            torch.tensor(prompt.input_ids),
            torch.tensor(prompt.is_multimodal),
            prompt.placeholders,
            **prompt.mm_kwargs,
        )
    assert logits.shape == (len(prompt.input_ids), VOCAB_SIZE)


def test_the_upstream_bug_fails_the_same_request(monkeypatch):
    """Mutant ``lora-wrapper-on-video-markers``: the video marker tokens go through the LoRA
    wrapper (pre-#56231). With a mapping sized to the prompt, the per-video token ids are read
    against the mapping and the request fails."""
    video = Video(torch.zeros(4, 32, 32, 3, dtype=torch.uint8))
    probe = vl_with_lora(4096)[2]
    tokens = len(probe("<video>?", videos=[video]).input_ids)
    model, _lora, proc = vl_with_lora(tokens // 4)  # fewer entries than the video's markers
    prompt = proc("<video>?", videos=[video])
    REFERENCE_MUTANTS["lora-wrapper-on-video-markers"](monkeypatch.setattr)
    with pytest.raises(LoRAError, match="but the mapping holds"):
        model.multimodal.embed_multimodal(**prompt.mm_kwargs)


def test_embedding_adapter_with_video_warns():
    model = NemotronHForCausalLM(tiny_text_config("M*"))
    with pytest.warns(UserWarning, match="do not receive its embedding delta"):
        warn_video_tokens_without_delta(random_adapter(model, "emb", 2, 0))
    plain = random_adapter(model, "no-emb", 2, 0, embeddings=False)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_video_tokens_without_delta(plain)
    assert dataclasses.is_dataclass(plain)


def test_serving_a_video_request_warns_once_per_adapter(lm):
    import warnings

    lora = apply_lora(lm, max_loras=2, max_rank=2, max_num_batched_tokens=64)
    lora.load(random_adapter(lm, "emb", 2, 0))
    lora.load(random_adapter(lm, "plain", 2, 1, embeddings=False))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lora.prepare([("emb", 10, True), ("emb", 5, True), ("plain", 5, True), (None, 3, True)])
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1
    assert "'emb' trains embed_tokens" in messages[0]
    assert lora.context.mapping[:23].tolist() == [0] * 15 + [1] * 5 + [-1] * 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lora.prepare([("emb", 4, False)])  # no video: no warning
    with pytest.raises(LoRAError, match="'missing' is not loaded"):
        lora.prepare([("missing", 1, False)])
