"""Loading NemotronH weights in checkpoint naming; every problem listed in one error."""

from __future__ import annotations

import pytest
import torch

from harness.oracles.transformers_models import transformers_nemotron_h
from reference_impl.nemotron_h import NemotronHForCausalLM
from reference_impl.presets import tiny_text_config
from reference_impl.weights import WeightLoadError, load_safetensors, load_state_dict

CONFIG = tiny_text_config("M*-E")


def checkpoint_state_dict():
    """The transformers state dict renamed to the checkpoint form: ``backbone.``,
    ``embeddings``, per-expert tensors, plus an MTP tensor the loader must skip."""
    hf = transformers_nemotron_h(CONFIG, seed=1)
    out = {}
    for name, tensor in hf.state_dict().items():
        name = name.replace("model.", "backbone.", 1) if name.startswith("model.") else name
        if ".experts.up_proj" in name or ".experts.down_proj" in name:
            base, proj = name.rsplit(".", 1)
            for j in range(tensor.shape[0]):
                out[f"{base}.{j}.{proj}.weight"] = tensor[j].clone()
        else:
            out[name] = tensor.clone()
    out["mtp.layers.0.norm.weight"] = torch.ones(CONFIG.hidden_size)
    return hf, out


def test_checkpoint_naming_loads_and_matches():
    hf, state = checkpoint_state_dict()
    assert any(k.startswith("backbone.embeddings") for k in state)
    model = NemotronHForCausalLM(CONFIG).eval()
    load_state_dict(model, state)
    ids = torch.arange(12)[None] % CONFIG.vocab_size
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max() <= 1e-4


def test_every_problem_in_one_error():
    _, state = checkpoint_state_dict()
    del state["backbone.norm_f.weight"]
    del state["backbone.layers.1.mixer.k_proj.weight"]
    del state["backbone.layers.3.mixer.experts.5.up_proj.weight"]
    state["backbone.layers.0.mixer.not_a_param"] = torch.zeros(1)
    state["backbone.layers.0.mixer.D"] = torch.zeros(CONFIG.mamba_num_heads + 1)
    with pytest.raises(WeightLoadError) as info:
        load_state_dict(NemotronHForCausalLM(CONFIG), state)
    error = info.value
    assert "model.norm_f.weight" in error.missing
    assert "model.layers.1.mixer.k_proj.weight" in error.missing
    assert "model.layers.3.mixer.experts.up_proj expert 5" in error.missing
    assert error.unexpected == ["backbone.layers.0.mixer.not_a_param"]
    assert error.mis_shaped == ["model.layers.0.mixer.D (expected (4,), got (5,))"]
    message = str(error)
    assert "3 missing" in message
    assert "1 unexpected" in message


def test_failed_load_changes_nothing():
    _, state = checkpoint_state_dict()
    del state["backbone.norm_f.weight"]
    model = NemotronHForCausalLM(CONFIG)
    before = model.model.embed_tokens.weight.clone()
    with pytest.raises(WeightLoadError):
        load_state_dict(model, state)
    assert torch.equal(model.model.embed_tokens.weight, before)


def test_tied_head_must_equal_the_embeddings():
    config = tiny_text_config("M*", tie_word_embeddings=True)
    state = dict(NemotronHForCausalLM(config).state_dict())
    load_state_dict(NemotronHForCausalLM(config), state)  # equal: fine
    state["lm_head.weight"] = state["lm_head.weight"] + 1
    with pytest.raises(WeightLoadError, match="differs from the embeddings"):
        load_state_dict(NemotronHForCausalLM(config), state)


def test_safetensors_round_trip(tmp_path):
    from safetensors.torch import save_file

    _, state = checkpoint_state_dict()
    path = tmp_path / "model.safetensors"
    save_file(state, str(path))
    model = NemotronHForCausalLM(CONFIG)
    load_safetensors(model, path)
    assert torch.equal(model.model.norm_f.weight, state["backbone.norm_f.weight"])
