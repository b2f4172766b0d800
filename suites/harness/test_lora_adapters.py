"""The adapter folders the LoRA checks serve: PEFT's format, written right for the checkpoint;
bad specs and bad folders refused naming what is wrong."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from harness.checkpoints.lora_adapters import (
    ADAPTERS_BY_NAME,
    AdapterSpec,
    adapter_tensors,
    write_adapter,
)
from harness.checkpoints.spec import ModelSpec
from reference_impl.adapters import read_peft_adapter
from reference_impl.lora import LoRAError

SPEC = ModelSpec()


def test_a_folder_is_a_peft_lora_adapter(tmp_path):
    adapter = ADAPTERS_BY_NAME["rank-4"]
    folder = write_adapter(SPEC, adapter, tmp_path / "a")
    config = json.loads((folder / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 8.0)
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    # The tiny V2 language model: Mamba (layer 0), MLP (layer 1), attention (layer 2), 64 wide,
    # MLP 128 wide, 4 query heads and 2 KV heads of 16, Mamba in_proj 196 out.
    prefix = "base_model.model.language_model.backbone.layers."
    shapes = {
        "0.mixer.in_proj": (196, 64),
        "0.mixer.out_proj": (64, 64),
        "1.mixer.up_proj": (128, 64),
        "1.mixer.down_proj": (64, 128),
        "2.mixer.q_proj": (64, 64),
        "2.mixer.k_proj": (32, 64),
        "2.mixer.v_proj": (32, 64),
        "2.mixer.o_proj": (64, 64),
    }
    expected = {}
    for module, (out_features, in_features) in shapes.items():
        expected[f"{prefix}{module}.lora_A.weight"] = (4, in_features)
        expected[f"{prefix}{module}.lora_B.weight"] = (out_features, 4)
    assert {k: tuple(t.shape) for k, t in tensors.items()} == expected
    assert all(bool(t.abs().sum() > 0) for t in tensors.values()), "a factor is all zeros"


def test_the_reference_reads_the_folder_back(tmp_path):
    adapter = ADAPTERS_BY_NAME["lm-embeddings"]
    read = read_peft_adapter(write_adapter(SPEC, adapter, tmp_path / "a"), "a")
    assert (read.rank, read.alpha, read.scaling) == (8, 16.0, 2.0)
    assert "model.embed_tokens" in read.weights
    assert "lm_head" in read.weights
    assert "model.layers.2.mixer.q_proj" in read.weights
    a, b = read.weights["model.embed_tokens"]
    assert (tuple(a.shape), tuple(b.shape)) == ((8, 266), (64, 8))
    rslora = ADAPTERS_BY_NAME["rslora"]
    assert read_peft_adapter(write_adapter(SPEC, rslora, tmp_path / "r"), "r").scaling == (
        pytest.approx(4.0 / 8**0.5)
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"rank": 0}, "AdapterSpec.rank: expected a positive rank, got 0"),
        ({"target_modules": "(unclosed"}, "AdapterSpec.target_modules: expected a regular"),
        ({"target_modules": ()}, "AdapterSpec.target_modules: expected at least one module"),
    ],
)
def test_a_bad_adapter_spec_is_refused_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        AdapterSpec(**{"name": "bad", "target_modules": ("q_proj",), **fields})


def test_targets_matching_nothing_are_refused():
    with pytest.raises(ValueError, match="target_modules 'nothing' match no linear layer"):
        adapter_tensors(SPEC, AdapterSpec("none", "nothing"))


def test_a_broken_folder_is_refused_naming_the_file(tmp_path):
    with pytest.raises(LoRAError, match=r"adapter_config\.json: expected a PEFT adapter file"):
        read_peft_adapter(tmp_path, "empty")
    folder = write_adapter(SPEC, ADAPTERS_BY_NAME["rank-4"], tmp_path / "a")
    save_file({"not.a.lora.key": torch.zeros(2)}, str(folder / "adapter_model.safetensors"))
    with pytest.raises(LoRAError, match=r"'not\.a\.lora\.key' is not a PEFT LoRA key"):
        read_peft_adapter(folder, "a")
