"""Weight loading through the target's own loader, from the checkpoint folder's tensors.

- Every parameter is loaded and equals the checkpoint's tensor (every tensor in the folder is
  random, norms and biases too, so a tensor loaded under the wrong name cannot match), and every
  tensor of the folder that the architecture's model holds is in some parameter: a loader that
  skips a tensor it built no parameter for (``use_bias`` read wrongly) drops it silently.
- Text-only mode (every modality limit 0) loads the language model and never reads a tower's
  tensor (vLLM PR #41205).
- Weights streamed one at a time from buffers the stream reuses, as streaming loaders do, load
  the same values as a plain mapping (vLLM PR #42244).
- ``language_model.backbone.*`` and ``language_model.model.*`` names both load (vLLM #39901).
- A Parakeet config with ``convolution_bias = False`` loads a file that carries the
  convolution biases all the same (vLLM #40007).
- A quantized checkpoint's config names its modules as the checkpoint does
  (``language_model.backbone.*``): the modules it keeps unquantized are built unquantized, the
  others quantized (vLLM #39901). Targets with quantization only: the reference has none, and
  says so (the check skips there with that reason).
- A missing or an unexpected tensor is named in a clear error, never silently skipped.

The comparison starts from parameters (and the buffers a checkpoint carries) set to NaN, so one
the loader leaves alone is seen as not loaded, whatever its initial value. On vLLM the expected
tensor of each parameter follows vLLM's naming (fused q/k/v, ``A = -exp(A_log)``, RADIO's
renamed blocks), written from vLLM's loader, independently of the reference that wrote the
folder: every vLLM parameter equal to the folder's tensor also shows that the reference's
checkpoint naming is the checkpoint's. On the reference the comparison maps names with the
reference's own checkpoint naming, so it checks what was loaded, not the naming.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from harness.checkpoints.cache import checkpoint_folder, checkpoint_weights
from harness.checkpoints.spec import ModelSpec
from harness.checkpoints.weight_streams import renamed, reusing_buffers
from harness.oracles.assertions import raises_clear_error

pytestmark = pytest.mark.concern("weights")

VARIANTS = {
    "default": ModelSpec(),
    "mtp": ModelSpec(mtp=True),
    "dynamic-t2": ModelSpec(dynamic_resolution=True, video_temporal_patch_size=2),
    "no-audio": ModelSpec(audio=False),
    # ``convolution_bias = False`` with the convolution biases in the file, as released Omni
    # checkpoints carry them: they load without an error (vLLM #40007 skips them).
    "no-conv-bias": ModelSpec(audio_convolution_bias=False),
    # Every layer kind of the Omni language model (MoE included): vLLM builds it on CUDA only.
    "omni-lm": ModelSpec(language_model="omni"),
    # Every other size and bias switch the language model's and Parakeet's vLLM code reads
    # (spec.OTHER_TEXT_SIZES, OTHER_SOUND_SIZES), and a wider language model: a size vLLM read
    # wrongly builds a parameter of another shape, which must not hold the checkpoint's tensor.
    "other-sizes": ModelSpec(text_sizes="other", sound_sizes="other", hidden_size=96),
}


def checkpoint(spec: ModelSpec):
    return checkpoint_weights(spec)


def names_for(name: str) -> list[str]:
    """Ways an error may name a checkpoint tensor (a target names it by its own parameter name,
    whose prefix may differ): the whole name; from its layer on, with or without the last
    component; its last two components when they say more than an index and ``weight``."""
    names = [name]
    found = re.search(r"(layers|blocks)\.\d+\..*", name)
    if found is not None:
        names += [found.group(0), found.group(0).rsplit(".", 1)[0]]
    last_two = name.split(".")[-2:]
    if not last_two[0].isdigit():
        names.append(".".join(last_two))
    return names


def assert_all_loaded(result, only: str = "") -> None:
    not_loaded = [n for n in result.not_loaded if n.startswith(only)]
    differing = [n for n in result.differing if n.startswith(only)]
    unheld = [n for n in result.unheld if n.startswith(only)]
    assert not_loaded == [], f"{len(not_loaded)} parameters not loaded: {not_loaded[:8]}"
    assert differing == [], f"{len(differing)} parameters differ: {differing[:8]}"
    assert unheld == [], f"{len(unheld)} checkpoint tensors in no parameter: {unheld[:8]}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_parameter_is_loaded_from_the_checkpoint(target, variant):
    spec = VARIANTS[variant]
    result = target.load_weights(spec, checkpoint(spec).items())
    assert_all_loaded(result)


def test_text_only_loads_the_language_model_and_never_reads_a_tower(target):
    spec = ModelSpec()
    result = target.load_weights(spec, checkpoint(spec).items(), text_only=True)
    assert result.tower_tensors_read == [], (
        f"text-only mode read {len(result.tower_tensors_read)} tower tensors, e.g. "
        f"{sorted(set(result.tower_tensors_read))[:5]}"
    )
    assert_all_loaded(result, only="language_model.")


@pytest.mark.parametrize("variant", ["default", "dynamic-t2"])
def test_streamed_weights_in_reused_buffers_load_the_same_values(target, variant):
    spec = VARIANTS[variant]
    result = target.load_weights(spec, reusing_buffers(checkpoint(spec)))
    assert_all_loaded(result)


def test_language_model_model_names_load_like_backbone_names(target):
    spec = ModelSpec()
    weights = renamed(checkpoint(spec), "language_model.backbone.", "language_model.model.")
    assert not any(name.startswith("language_model.backbone.") for name in weights)
    assert_all_loaded(target.load_weights(spec, weights.items()))


def test_quantization_config_names_are_matched_to_the_built_layers(target):
    """Applies to targets with quantization (vllm, vllm-file); the reference raises
    NotImplementedByTarget (the check skips with its reason). Expected from the checkpoint
    alone: a layer is quantized iff its weight in the file is fp8 (it has a ``weight_scale``);
    each layer in ``ignored_layers`` is not. Built by the target's constructor, not loaded:
    vLLM's fp8 post-load step needs its compiled ops (``vllm._C``), which a CPU install without
    them lacks."""
    spec = ModelSpec(quantization="fp8")
    config = json.loads((checkpoint_folder(spec) / "config.json").read_text())
    ignored = set(config["quantization_config"]["ignored_layers"])
    weights = checkpoint_weights(spec)
    quantized = {n.removesuffix(".weight_scale") for n in weights if n.endswith(".weight_scale")}
    assert quantized, "the fp8 checkpoint has no fp8 weight"
    assert not quantized & ignored, f"fp8 weights of ignored layers: {quantized & ignored}"
    built = target.linear_quantization(spec)  # the reference: skips, naming why
    unseen = sorted(
        n
        for n in quantized | {n for n in ignored if n.startswith("language_model.backbone.")}
        if n not in built
    )
    assert unseen == [], f"{len(unseen)} checkpoint layers not among the built ones: {unseen[:8]}"
    wrong = [
        f"{name}: built {method or 'unquantized'}, expected "
        + ("quantized (fp8 weight in the file)" if name in quantized else "unquantized")
        + (" (in the config's ignored_layers)" if name in ignored else "")
        for name, method in sorted(built.items())
        if (method is not None) != (name in quantized)
    ]
    assert wrong == [], f"{len(wrong)} layers built against the checkpoint's config: {wrong[:6]}"


MISSING = [
    "language_model.backbone.norm_f.weight",
    "vision_model.radio_model.model.blocks.3.mlp.fc1.weight",
    "mlp1.1.weight",
    "sound_projection.linear1.weight",
]


@pytest.mark.parametrize("name", MISSING)
def test_a_missing_tensor_is_named(target, name):
    spec = ModelSpec()
    weights = checkpoint(spec)
    del weights[name]
    with raises_clear_error(*names_for(name)):
        target.load_weights(spec, weights.items())


#: One tensor of each kind of layer (Mamba's projection and convolution, attention, MLP, RADIO,
#: the connector, Parakeet's attention), each given one row more than the config's sizes give:
#: a loader that slices a tensor to its parameter's shard (tensor parallelism's ``narrow``) must
#: still refuse one of another shape, or a config that disagrees with its weights (or a size
#: the target read wrongly) is served with truncated weights.
RESHAPED = [
    "language_model.backbone.layers.0.mixer.in_proj.weight",
    "language_model.backbone.layers.0.mixer.conv1d.weight",
    "language_model.backbone.layers.1.mixer.up_proj.weight",
    "language_model.backbone.layers.2.mixer.q_proj.weight",
    "vision_model.radio_model.model.blocks.3.mlp.fc1.weight",
    "mlp1.1.weight",
    "sound_encoder.encoder.layers.0.self_attn.q_proj.weight",
]


@pytest.mark.parametrize("name", RESHAPED)
def test_a_tensor_of_another_shape_is_refused_naming_it(target, name):
    spec = ModelSpec()
    weights = checkpoint(spec)
    weights[name] = torch.cat([weights[name], weights[name][:1]])
    with raises_clear_error(*names_for(name)):
        target.load_weights(spec, weights.items())


#: Tensors no parameter of the default variant takes: unknown names, and biases of layers
#: whose config switch is off (``use_bias``, ``mlp_bias`` false): a checkpoint that carries them
#: disagrees with its config, or the target read the switch wrongly.
UNEXPECTED = [
    "language_model.backbone.layers.0.mixer.mystery.weight",
    "vision_model.radio_model.model.blocks.0.mystery.weight",
    "mystery.weight",
    "language_model.backbone.layers.0.mixer.in_proj.bias",
    "language_model.backbone.layers.1.mixer.up_proj.bias",
]


@pytest.mark.parametrize("name", UNEXPECTED)
def test_an_unexpected_tensor_is_named(target, name):
    spec = ModelSpec()
    weights = checkpoint(spec) | {name: torch.zeros(4)}
    with raises_clear_error(*names_for(name)):
        target.load_weights(spec, weights.items())
