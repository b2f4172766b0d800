"""Input-type routing: every key reaches its modality, in first-key order, nothing dropped.

Upstream (vLLM PR #56398) ``video_embeds`` was parsed but never routed: precomputed video
embeddings silently produced 0 outputs.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.inputs import model_kwargs, strategies
from harness.oracles.assertions import (
    assert_clear_error,
    assert_close_tensors,
    is_clear_error,
    raises_clear_error,
)
from reference_impl.tokenizer import shared_tokenizer

pytestmark = pytest.mark.concern("model")

KIND_OF_KEY = {
    "image_embeds": "image_embeds",
    "pixel_values_flat": "pixel_values",
    "video_embeds": "video_embeds",
    "pixel_values_flat_video": "pixel_values_videos",
    "input_audio_features": "audio_features",
}


def one_group(spec, key, seed=0):
    if key in ("image_embeds", "video_embeds"):
        return model_kwargs.embeddings(spec, key, [3, 3], stacked=True, seed=seed)
    if key == "pixel_values_flat":
        return model_kwargs.image_pixels(spec, [2, 1], seed=seed)
    if key == "pixel_values_flat_video":
        return model_kwargs.video_pixels(spec, [2, 3], seed=seed)
    return model_kwargs.audio_features(spec, [1, 2], seed=seed)


@pytest.mark.parametrize("key", model_kwargs.ROUTING_KEYS)
def test_each_form_reaches_its_modality(model, key):
    group = one_group(model.spec, key)
    parsed = model.parse(**group.kwargs)
    assert list(parsed) == [group.modality], f"{key} routed to {list(parsed)}"
    assert parsed[group.modality].kind == KIND_OF_KEY[key]
    assert parsed[group.modality].num_items == group.num_items
    out = model.embed_multimodal(**group.kwargs)
    assert len(out) == group.num_items, f"{key}: {group.num_items} items, {len(out)} outputs"
    ran_encoder = bool(model.calls.vision or model.calls.audio)
    assert ran_encoder == group.uses_encoder, (
        f"{key}: encoder ran={ran_encoder}, expected {group.uses_encoder}"
    )


def test_image_tiles_give_their_placeholder_rows(model):
    """Static tiles: each image gives ``tiles * tokens_per_tile`` rows of the hidden size."""
    group = model_kwargs.image_pixels(model.spec, [1, 3, 2])
    out = model.embed_multimodal(**group.kwargs)
    expected = [(n * model.spec.tokens_per_tile, model.spec.hidden_size) for n in (1, 3, 2)]
    assert [tuple(o.shape) for o in out] == expected


def test_videos_fill_their_whole_replacement(model):
    """Each video's embedding covers every placeholder of its replacement: separator text,
    ``<img>``/``</img>`` and the context tokens, as the processor tokenises them."""
    frames = [2, 3]
    group = model_kwargs.video_pixels(model.spec, frames)
    out = model.embed_multimodal(**group.kwargs)
    tokenizer = shared_tokenizer()
    for i, n in enumerate(frames):
        # The architecture's replacement (T = 1, frames 0..n-1 at 500 ms): per frame the
        # separator's own tokens, <img>, the frame's context tokens, </img>.
        separators = [
            ("\n" if k else "") + f"Frame {k + 1} sampled at {k * 500 / 1000:.2f} seconds: "
            for k in range(n)
        ]
        separator_tokens = sum(
            len(tokenizer.encode(text, add_special_tokens=False)) for text in separators
        )
        rows = separator_tokens + n * (1 + model.spec.tokens_per_tile + 1)
        assert tuple(out[i].shape) == (rows, model.spec.hidden_size), f"video {i}"


def encoder_frames(feature_frames: int, kernel: int, stride: int, factor: int) -> int:
    """The architecture's Parakeet subsampling length, written here from the brief: log2(factor)
    times ``L = floor((L + add_pad) / stride + 1)`` with ``add_pad = ((k - 1) // 2) * 2 - k``."""
    length = feature_frames
    for _ in range(factor.bit_length() - 1):
        length = (length + ((kernel - 1) // 2) * 2 - kernel) // stride + 1
    return length


def test_audio_gives_valid_frames_only(model):
    """Audio: each item concatenates its clips' valid (unpadded) encoder frames, as many as the
    encoder's strided convolutions leave of each clip's valid feature frames."""
    group = model_kwargs.audio_features(model.spec, [2, 1], frames=40)
    mask = group.kwargs["feature_attention_mask"]
    sound = model.spec.vl_config().sound_config
    conv = (sound.subsampling_conv_kernel_size, sound.subsampling_conv_stride)
    valid = [encoder_frames(int(m.sum()), *conv, sound.subsampling_factor) for m in mask]
    out = model.embed_multimodal(**group.kwargs)
    assert [o.shape[0] for o in out] == [valid[0] + valid[1], valid[2]]


@pytest.mark.self_consistency("modalities together against each modality alone")
@pytest.mark.parametrize(
    "order",
    list(
        itertools.permutations(["image_embeds", "pixel_values_flat_video", "input_audio_features"])
    ),
    ids=lambda order: "-".join(order),
)
def test_output_order_follows_first_key(model, order):
    """Outputs come modality by modality in the order each modality's first key appears, and
    equal what each modality gives on its own."""
    groups = [one_group(model.spec, key, seed=i) for i, key in enumerate(order)]
    alone = [list(model.embed_multimodal(**g.kwargs)) for g in groups]
    together = model.embed_multimodal(**model_kwargs.combine(groups))
    assert_close_tensors(together, [t for outs in alone for t in outs], "-".join(order))
    parsed = model.parse(**model_kwargs.combine(groups))
    assert list(parsed) == model_kwargs.expected_modality_order(groups)


def test_audio_position_set_by_any_audio_key(model):
    """``audio_num_clips`` or ``feature_attention_mask`` first also places audio first."""
    audio = model_kwargs.audio_features(model.spec, [1])
    images = model_kwargs.embeddings(model.spec, "image_embeds", [2], stacked=True)
    kwargs = {"audio_num_clips": audio.kwargs["audio_num_clips"], **images.kwargs}
    kwargs.update(audio.kwargs)
    assert list(model.parse(**kwargs)) == ["audios", "images"]


@pytest.mark.self_consistency("a call with unrelated arguments against the same call without")
def test_unrelated_kwargs_are_ignored(model):
    """The model receives other arguments too; they change nothing."""
    groups = [one_group(model.spec, "video_embeds"), one_group(model.spec, "pixel_values_flat")]
    plain = model.embed_multimodal(**model_kwargs.combine(groups))
    noisy = dict(strategies.UNRELATED_KWARGS, **model_kwargs.combine(groups))
    noisy["input_ids"] = torch.arange(7)
    noisy["positions"] = torch.arange(7)
    assert_close_tensors(model.embed_multimodal(**noisy), plain, "with unrelated kwargs")


@pytest.mark.parametrize("modality", ["images", "videos"])
def test_both_forms_of_one_modality_are_not_silently_dropped(model, modality):
    """Pixels and embeddings of the same modality in one call: either both give outputs, or a
    clear error names them. Dropping one form silently is the failure."""
    spec = model.spec
    if modality == "images":
        groups = [one_group(spec, "image_embeds"), one_group(spec, "pixel_values_flat")]
    else:
        groups = [one_group(spec, "video_embeds"), one_group(spec, "pixel_values_flat_video")]
    try:
        out = model.embed_multimodal(**model_kwargs.combine(groups))
    except Exception as exc:
        assert_clear_error(exc, [g.key for g in groups])
        return
    assert len(out) == sum(g.num_items for g in groups), (
        f"{len(out)} outputs for {sum(g.num_items for g in groups)} items: "
        "one form was silently dropped"
    )


@pytest.mark.parametrize(
    ("key", "missing"),
    [
        ("pixel_values_flat", "image_num_patches"),
        ("pixel_values_flat_video", "video_num_patches"),
        ("input_audio_features", "feature_attention_mask"),
        ("input_audio_features", "audio_num_clips"),
    ],
)
def test_incomplete_inputs_raise_a_clear_error(model, key, missing):
    group = one_group(model.spec, key)
    kwargs = {k: v for k, v in group.kwargs.items() if k != missing}
    with raises_clear_error(missing):
        model.embed_multimodal(**kwargs)


VARIANTS = {
    # The contract every target must meet: no None-valued keys, equal-length embedding lists.
    "core": {"ragged": False, "none_keys": False},
    "ragged-lists": {"ragged": True, "none_keys": False},
    "none-keys": {"ragged": False, "none_keys": True},
}


@pytest.mark.self_consistency(
    "outputs of a mixed call against each group alone (the output count is independent)"
)
@pytest.mark.parametrize("variant", VARIANTS)
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # a factory: new model each
@given(data=st.data())
def test_nothing_is_silently_dropped(make_model, variant, data):
    """Any subset of modalities, routing keys, item counts, key orders and unrelated keys: every
    provided item yields an output (matching what its group gives alone, in first-key order),
    or the call raises a clear error naming a provided key."""
    model = make_model()
    request = data.draw(strategies.embed_calls(model.spec, **VARIANTS[variant]), label="request")
    try:
        out = model.embed_multimodal(**request.kwargs)
    except Exception as exc:
        assert is_clear_error(exc, [g.key for g in request.groups]), (
            f"unclear error for keys {[g.key for g in request.groups]}: {type(exc).__name__}: {exc}"
        )
        return
    assert len(out) == request.num_items, (
        f"{request.num_items} items, {len(out)} outputs for {[g.key for g in request.groups]}"
    )
    expected = [t for g in request.groups for t in model.embed_multimodal(**g.kwargs)]
    assert_close_tensors(out, expected, "outputs")
