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
from harness.checkpoints import cache
from harness.checkpoints.cache import (
    SHARED_FOLDERS_ENV,
    checkpoint_folder,
    folder_name,
    shared_folders,
)
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
        "generation_config.json",
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


def test_the_tokenizer_renders_a_chat_with_its_template(folder):
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(folder)
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "<image>\nWhat is it?"},
    ]
    rendered = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n<image>\nWhat is it?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    generation = GenerationConfig.from_pretrained(folder)
    assert (generation.bos_token_id, generation.eos_token_id) == (
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
    )


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


SMALL = ModelSpec(image_size=32, audio=False, hidden_size=32)


def test_the_kept_folder_is_shared_by_a_block_and_outlives_it(tmp_path, monkeypatch):
    """Unset, the block shares the kept folder and leaves it (with its folders) for the next
    run; an inner block keeps the outer one's folder; the variable is unset again after it."""
    monkeypatch.delenv(SHARED_FOLDERS_ENV, raising=False)
    monkeypatch.setattr(cache, "DEFAULT_SHARED_FOLDERS", tmp_path / "kept")
    monkeypatch.setattr(cache, "_FOLDERS", {})
    with shared_folders() as outer:
        assert outer == tmp_path / "kept"
        assert os.environ[SHARED_FOLDERS_ENV] == str(outer)
        with shared_folders() as inner:
            assert inner == outer
        folder = checkpoint_folder(SMALL)
        assert folder.parent == outer
    assert folder.is_dir()
    assert SHARED_FOLDERS_ENV not in os.environ


def test_off_gives_a_run_a_temporary_folder_removed_at_its_end(monkeypatch):
    monkeypatch.setenv(SHARED_FOLDERS_ENV, cache.SHARED_FOLDERS_OFF)
    with shared_folders() as outer:
        assert outer.is_dir()
        assert outer != cache.DEFAULT_SHARED_FOLDERS
        assert os.environ[SHARED_FOLDERS_ENV] == str(outer)
        with shared_folders() as inner:
            assert inner == outer
        assert outer.is_dir()  # the inner block left the outer one's folder in place
    assert not outer.exists()
    assert os.environ[SHARED_FOLDERS_ENV] == cache.SHARED_FOLDERS_OFF


def test_off_outside_a_block_writes_a_folder_per_process(monkeypatch):
    monkeypatch.setenv(SHARED_FOLDERS_ENV, cache.SHARED_FOLDERS_OFF)
    monkeypatch.setattr(cache, "_FOLDERS", {})
    folder = checkpoint_folder(SMALL)
    assert folder.parent == cache._TEMP_ROOT[0]
    assert folder.name == f"{folder_name(SMALL)}-seed0"


def test_kept_folders_lose_what_other_code_wrote_once_it_is_an_hour_old(tmp_path):
    """Kept: this code's folders, however old, and anything younger than an hour (a run of
    other code, or a writer, may still be reading or writing it). Removed: the rest."""
    digest = cache.writer_digest()
    now = 1_000_000.0
    hour = cache.STALE_AFTER_S
    ages = {
        f"a-seed0-{digest}": 10 * hour,  # this code's: kept
        "a-seed0-0123456789ab": hour,  # other code's, an hour old: removed
        "b-seed0-0123456789ab": hour - 60,  # other code's, younger: kept
        f".a-seed0-{digest}-x1y2": hour + 1,  # a dead writer's private copy: removed
        f".a-seed0-{digest}-z3w4": 60,  # a writer still writing: kept
    }
    for name, age in ages.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
        os.utime(tmp_path / name, (now - age, now - age))
    assert cache.kept_folders(tmp_path, now=now) == tmp_path
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"a-seed0-{digest}", "b-seed0-0123456789ab", f".a-seed0-{digest}-z3w4"]
    )


def test_the_writer_digest_names_the_libraries_that_write_a_folder(monkeypatch):
    """A new torch (or safetensors, tokenizers, transformers) may draw or serialize other bytes:
    its folders never share a name with the old one's."""
    import importlib.metadata

    before = cache.writer_digest()
    real = importlib.metadata.version
    cache.writer_digest.cache_clear()
    try:
        monkeypatch.setattr(
            importlib.metadata,
            "version",
            lambda name: "0.0.0" if name == "safetensors" else real(name),
        )
        assert cache.writer_digest() != before
    finally:
        monkeypatch.undo()
        cache.writer_digest.cache_clear()
    assert cache.writer_digest() == before


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
