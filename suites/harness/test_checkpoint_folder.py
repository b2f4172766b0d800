"""The tiny checkpoint folder: what a user could point vLLM at, written from the reference.

Checked with real loaders, not our own: transformers' ``AutoConfig`` (the folder's
configuration module through ``auto_map`` and ``trust_remote_code``) and ``AutoTokenizer``,
and safetensors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import ROOT
from harness.checkpoints.cache import SHARED_FOLDERS_ENV, checkpoint_folder, shared_folders
from harness.checkpoints.spec import CONFIG_MODULE, ModelSpec
from harness.checkpoints.writer import write_checkpoint
from reference_impl.checkpoint import CONV_BIAS_SUFFIXES, read_weights
from reference_impl.tokenizer import AUDIO_CONTEXT, IMG_CONTEXT, VIDEO_PLACEHOLDER, VOCAB_SIZE


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_checkpoint(ModelSpec(mtp=True), tmp_path_factory.mktemp("ckpt"))


def test_the_folder_holds_what_a_checkpoint_holds(folder):
    names = {p.name for p in folder.iterdir()}
    assert names == {
        "config.json",
        CONFIG_MODULE.name,
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors",
    }
    data = json.loads((folder / "config.json").read_text())
    assert data["architectures"] == ["NemotronH_Nano_VL_V2"]
    assert data["auto_map"]["AutoConfig"].startswith(CONFIG_MODULE.stem + ".")
    assert data["text_config"]["num_nextn_predict_layers"] == 1


def test_transformers_reads_the_config_through_auto_map(folder):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
    assert type(config).__name__ == "NanoNemotronVLConfig"
    assert config.text_config.hybrid_override_pattern == "M-*"
    assert config.text_config.vocab_size == VOCAB_SIZE
    assert config.vision_config.args["model"] == "vit_small_patch16_224"
    assert config.sound_config.num_mel_bins == ModelSpec().num_mel_bins


def test_the_tokenizer_loads_with_the_models_special_tokens(folder):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    for token in (IMG_CONTEXT, VIDEO_PLACEHOLDER, AUDIO_CONTEXT, "<img>", "</img>"):
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token
    assert len(tokenizer) == VOCAB_SIZE


def test_every_tensor_is_random_and_distinct(folder):
    """No tensor is all one value (a default init a misnamed tensor could match), and no two
    tensors of one shape are equal."""
    weights = read_weights(folder)
    assert any(n.startswith("vision_projector.vision_final_layernorm.") for n in weights)
    seen: dict[tuple[int, ...], list[torch.Tensor]] = {}
    for name, tensor in weights.items():
        if not tensor.is_floating_point() or tensor.numel() < 2:
            continue
        assert tensor.float().std() > 0, f"{name} is constant"
        for other in seen.setdefault(tuple(tensor.shape), []):
            assert not torch.equal(tensor, other), f"{name} equals another tensor"
        seen[tuple(tensor.shape)].append(tensor)


def test_a_bad_spec_is_named():
    with pytest.raises(
        ValueError, match=r"video_temporal_patch_size: expected one of \[1, 2\], got 3"
    ):
        ModelSpec(video_temporal_patch_size=3)
    with pytest.raises(ValueError, match=r"language_model: expected one of \['v2', 'omni'\]"):
        ModelSpec(language_model="v3")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"max_num_tiles: expected 1\.\.12, got 0"):
        ModelSpec(max_num_tiles=0)


def test_a_bias_free_parakeet_checkpoint_still_carries_its_conv_biases(tmp_path):
    """The Omni form: ``convolution_bias = False`` in the config, the convolution biases in the
    file (one per convolution of each layer); the reference loads it, skipping them."""
    from reference_impl.checkpoint import load_folder
    from reference_impl.tokenizer import shared_tokenizer

    spec = ModelSpec(audio_convolution_bias=False)
    folder = write_checkpoint(spec, tmp_path / "ckpt")
    data = json.loads((folder / "config.json").read_text())
    assert data["sound_config"]["convolution_bias"] is False
    layers = data["sound_config"]["num_hidden_layers"]
    biases = {n for n in read_weights(folder) if ".conv." in n and n.endswith("conv1.bias")}
    assert len(biases) == layers, biases
    model = load_folder(folder, shared_tokenizer())
    convs = [n for n, _ in model.named_parameters() if ".conv.pointwise_conv1." in n]
    assert len(convs) == layers, convs
    assert not [n for n, _ in model.named_parameters() if n.endswith(CONV_BIAS_SUFFIXES)]


# ---------------------------------------------------------------------------------------------
# One run's folders, shared by its processes


WRITE_SHARED = """
from harness.checkpoints.cache import checkpoint_folder
from harness.checkpoints.spec import ModelSpec
print(checkpoint_folder(ModelSpec(audio=False)))
"""


def test_processes_of_one_run_share_one_whole_folder(tmp_path):
    """Two processes started at once with the shared folder set: both read one folder, written
    whole (the same bytes as a folder written alone), and no half-written copy is left."""
    shared = tmp_path / "shared"
    shared.mkdir()
    env = {**os.environ, SHARED_FOLDERS_ENV: str(shared)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITE_SHARED],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
    paths = {Path(out.strip()) for out, _ in outputs}
    assert len(paths) == 1, paths
    (path,) = paths
    assert path.parent == shared
    assert [p.name for p in shared.iterdir()] == [path.name]  # no private copy left
    alone = write_checkpoint(ModelSpec(audio=False), tmp_path / "alone")
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        assert (path / name).read_bytes() == (alone / name).read_bytes(), name


def test_the_shared_folder_lives_for_its_block_and_an_inner_block_keeps_it(monkeypatch):
    monkeypatch.delenv(SHARED_FOLDERS_ENV, raising=False)
    with shared_folders() as outer:
        assert os.environ[SHARED_FOLDERS_ENV] == str(outer)
        with shared_folders() as inner:
            assert inner == outer
        assert outer.is_dir()  # the inner block left the outer one's folder in place
    assert not outer.exists()
    assert SHARED_FOLDERS_ENV not in os.environ


def test_a_shared_folder_that_is_gone_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv(SHARED_FOLDERS_ENV, str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match=f"{SHARED_FOLDERS_ENV}: expected an existing"):
        checkpoint_folder(ModelSpec(image_size=32, audio=False))


def test_every_field_of_a_spec_shows_in_its_folder_name():
    """One folder per spec: specs that differ in any field never share a name."""
    specs = [
        ModelSpec(),
        ModelSpec(image_size=32),
        ModelSpec(hidden_size=32),
        ModelSpec(projector_hidden_size=32),
        ModelSpec(num_mel_bins=32),
        ModelSpec(audio_hop_length=128),
        ModelSpec(max_model_len=256),
        ModelSpec(quantization="fp8"),
        ModelSpec(audio_convolution_bias=False),
        ModelSpec(mtp=True),
        ModelSpec(max_num_tiles=1),
    ]
    assert len({s.slug for s in specs}) == len(specs)
