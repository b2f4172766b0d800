"""The reference NemotronH: parity with transformers, caches, ragged batches, generation."""

from __future__ import annotations

import pytest
import torch

from harness.oracles.transformers_models import reference_from, transformers_nemotron_h
from reference_impl.presets import tiny_text_config

PATTERNS = {
    "all-kinds": tiny_text_config("M*-E"),
    "mamba-heavy": tiny_text_config("MM*MM-"),
    "moe-groups": tiny_text_config("EM*E", n_group=4, topk_group=2, num_experts_per_tok=3),
    "latent-moe": tiny_text_config("ME*", moe_latent_size=12),
    "tied": tiny_text_config("M-*", tie_word_embeddings=True),
    "one-group-mamba": tiny_text_config("M*M", n_groups=1, chunk_size=5),
    "biases": tiny_text_config("M*-E", use_bias=True, mlp_bias=True, use_conv_bias=False),
}


@pytest.fixture(scope="module", params=sorted(PATTERNS))
def pair(request):
    config = PATTERNS[request.param]
    hf = transformers_nemotron_h(config, seed=3)
    return config, hf, reference_from(hf, config)


def test_logits_match_transformers(pair):
    """Same random weights, same tokens: max abs logit difference <= 1e-4 in fp32."""
    config, hf, ours = pair
    ids = torch.randint(0, config.vocab_size, (2, 19), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(ids).logits
        actual = ours(ids)
    assert (actual - expected).abs().max() <= 1e-4


def test_prefill_equals_step_by_step_decode(pair):
    """Decoding token by token (sequential scan, conv window, KV cache) gives the prefill's
    logits (chunked scan, whole-sequence attention): <= 1e-4 in fp32."""
    config, _, ours = pair
    ids = torch.randint(0, config.vocab_size, (2, 17), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = ours(ids)
        cache = ours.new_cache(2, 17)
        steps = torch.cat([ours(ids[:, t : t + 1], cache=cache) for t in range(17)], dim=1)
        cache = ours.new_cache(2, 17)
        half = [ours(ids[:, :9], cache=cache)]
        half += [ours(ids[:, t : t + 1], cache=cache) for t in range(9, 17)]
    assert (steps - full).abs().max() <= 1e-4
    assert (torch.cat(half, dim=1) - full).abs().max() <= 1e-4


def test_greedy_generation_matches_transformers(pair):
    config, hf, ours = pair
    ids = torch.randint(0, config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = hf.generate(ids, max_new_tokens=5, do_sample=False)[:, 6:]
    assert torch.equal(ours.generate(ids, 5), expected)


def test_ragged_batch_equals_one_by_one():
    """Right-padded prompts of different lengths: each sequence's logits, its generated tokens,
    are those it gets alone."""
    config = PATTERNS["all-kinds"]
    ours = reference_from(transformers_nemotron_h(config, seed=5), config)
    gen = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, config.vocab_size, (n,), generator=gen) for n in (11, 4, 8)]
    lengths = torch.tensor([len(p) for p in prompts])
    batch = torch.zeros(3, 11, dtype=torch.int64)
    for i, p in enumerate(prompts):
        batch[i, : len(p)] = p
    with torch.no_grad():
        logits = ours(batch, lengths=lengths)
        tokens = ours.generate(batch, 4, lengths=lengths)
        for i, p in enumerate(prompts):
            alone = ours(p[None])
            assert (logits[i, : len(p)] - alone[0]).abs().max() <= 1e-4
            assert torch.equal(tokens[i], ours.generate(p[None], 4)[0])


def test_dt_clamp_is_a_documented_difference():
    """transformers clamps dt from below at time_step_min (prefill path); vLLM and the reference
    do not. With small dt the outputs differ; with the clamp removed they agree."""
    config = PATTERNS["mamba-heavy"]
    clamped = transformers_nemotron_h(config, seed=8, dt_clamp=True)
    ours = reference_from(clamped, config)
    with torch.no_grad():
        for layer in ours.model.layers:
            if hasattr(layer.mixer, "dt_bias"):
                layer.mixer.dt_bias.fill_(-10.0)  # softplus(-10 + dt) ~ 5e-5 < 1e-3
        for layer in clamped.model.layers:
            if hasattr(layer.mixer, "dt_bias"):
                layer.mixer.dt_bias.fill_(-10.0)
        ids = torch.randint(
            0, config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(9)
        )
        assert (clamped(ids).logits - ours(ids)).abs().max() > 1e-3
        for layer in clamped.model.layers:
            if hasattr(layer.mixer, "time_step_limit"):
                layer.mixer.time_step_limit = (0.0, float("inf"))
        assert (clamped(ids).logits - ours(ids)).abs().max() <= 1e-4


def test_per_layer_mlp_widths():
    config = tiny_text_config("-M-*-", intermediate_size=[8, 16, 24])
    model = reference_from(
        transformers_nemotron_h(tiny_text_config("-M-*-"), seed=0), tiny_text_config("-M-*-")
    )
    del model
    from reference_impl.nemotron_h import NemotronHForCausalLM

    widths = [
        layer.mixer.up_proj.out_features
        for layer in NemotronHForCausalLM(config).model.layers
        if layer.kind == "mlp"
    ]
    assert widths == [8, 16, 24]


def test_tied_head_is_the_embedding():
    from reference_impl.nemotron_h import NemotronHForCausalLM

    model = NemotronHForCausalLM(tiny_text_config("M*", tie_word_embeddings=True))
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_bad_calls_name_the_problem():
    from reference_impl.nemotron_h import NemotronHForCausalLM

    model = NemotronHForCausalLM(tiny_text_config("M*"))
    ids = torch.zeros(1, 4, dtype=torch.int64)
    with pytest.raises(ValueError, match="exactly one of input_ids or inputs_embeds"):
        model()
    with pytest.raises(ValueError, match=r"lengths: expected values in \[1, 4\]"):
        model(ids, lengths=torch.tensor([5]))
    cache = model.new_cache(1, 5)
    model(ids, cache=cache)
    with pytest.raises(ValueError, match="decodes one token at a time"):
        model(ids, cache=cache)
    model(ids[:, :1], cache=cache)
    with pytest.raises(ValueError, match="full at capacity 5"):
        model(ids[:, :1], cache=cache)
