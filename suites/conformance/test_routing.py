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

from harness import inputs, strategies
from harness.assertions import (
    assert_clear_error,
    assert_close_tensors,
    is_clear_error,
    raises_clear_error,
)
from reference_impl.processor import video_replacement_ids
from reference_impl.tokenizer import shared_tokenizer

KIND_OF_FORM = {
    "image_embeds": "image_embeds",
    "pixel_values_flat": "pixel_values",
    "video_embeds": "video_embeds",
    "pixel_values_flat_video": "pixel_values_videos",
    "input_audio_features": "audio_features",
}


def one_group(spec, form, seed=0):
    if form in ("image_embeds", "video_embeds"):
        return inputs.embeddings(spec, form, [3, 3], stacked=True, seed=seed)
    if form == "pixel_values_flat":
        return inputs.image_pixels(spec, [2, 1], seed=seed)
    if form == "pixel_values_flat_video":
        return inputs.video_pixels(spec, [2, 3], seed=seed)
    return inputs.audio_features(spec, [1, 2], seed=seed)


@pytest.mark.parametrize("form", inputs.FORMS)
def test_each_form_reaches_its_modality(shell, form):
    group = one_group(shell.spec, form)
    parsed = shell.parse(**group.kwargs)
    assert list(parsed) == [group.modality], f"{form} routed to {list(parsed)}"
    assert parsed[group.modality].kind == KIND_OF_FORM[form]
    assert parsed[group.modality].num_items == group.num_items
    out = shell.embed_multimodal(**group.kwargs)
    assert len(out) == group.num_items, f"{form}: {group.num_items} items, {len(out)} outputs"
    ran_encoder = bool(shell.calls.vision or shell.calls.audio)
    assert ran_encoder == group.uses_encoder, (
        f"{form}: encoder ran={ran_encoder}, expected {group.uses_encoder}"
    )


def test_image_tiles_give_their_placeholder_rows(shell):
    """Static tiles: each image gives ``tiles * tokens_per_tile`` rows of the hidden size."""
    group = inputs.image_pixels(shell.spec, [1, 3, 2])
    out = shell.embed_multimodal(**group.kwargs)
    expected = [(n * shell.spec.tokens_per_tile, shell.spec.hidden_size) for n in (1, 3, 2)]
    assert [tuple(o.shape) for o in out] == expected


def test_videos_fill_their_whole_replacement(shell):
    """Each video's embedding covers every placeholder of its replacement: separator text,
    ``<img>``/``</img>`` and the context tokens, as the processor tokenises them."""
    frames = [2, 3]
    group = inputs.video_pixels(shell.spec, frames)
    out = shell.embed_multimodal(**group.kwargs)
    per_frame = shell.spec.tokens_per_tile
    for i, n in enumerate(frames):
        ids = video_replacement_ids(shared_tokenizer(), [per_frame] * n, list(range(n)), 500)
        assert tuple(out[i].shape) == (len(ids), shell.spec.hidden_size), f"video {i}"


def test_audio_gives_valid_frames_only(shell):
    """Audio: each item concatenates its clips' valid (unpadded) encoder frames."""
    group = inputs.audio_features(shell.spec, [2, 1])
    mask = group.kwargs["feature_attention_mask"]
    stride = shell.spec.audio_subsampling
    valid = [(int(m.sum()) + stride - 1) // stride for m in mask]
    out = shell.embed_multimodal(**group.kwargs)
    assert [o.shape[0] for o in out] == [valid[0] + valid[1], valid[2]]


@pytest.mark.parametrize(
    "order",
    list(
        itertools.permutations(["image_embeds", "pixel_values_flat_video", "input_audio_features"])
    ),
    ids=lambda order: "-".join(order),
)
def test_output_order_follows_first_key(shell, order):
    """Outputs come modality by modality in the order each modality's first key appears, and
    equal what each modality gives on its own."""
    groups = [one_group(shell.spec, form, seed=i) for i, form in enumerate(order)]
    alone = [list(shell.embed_multimodal(**g.kwargs)) for g in groups]
    together = shell.embed_multimodal(**inputs.combine(groups))
    assert_close_tensors(together, [t for outs in alone for t in outs], "-".join(order))
    parsed = shell.parse(**inputs.combine(groups))
    assert list(parsed) == inputs.expected_modality_order(groups)


def test_audio_position_set_by_any_audio_key(shell):
    """``audio_num_clips`` or ``feature_attention_mask`` first also places audio first."""
    audio = inputs.audio_features(shell.spec, [1])
    images = inputs.embeddings(shell.spec, "image_embeds", [2], stacked=True)
    kwargs = {"audio_num_clips": audio.kwargs["audio_num_clips"], **images.kwargs}
    kwargs.update(audio.kwargs)
    assert list(shell.parse(**kwargs)) == ["audios", "images"]


def test_unrelated_kwargs_are_ignored(shell):
    """The model receives other arguments too; they change nothing."""
    groups = [one_group(shell.spec, "video_embeds"), one_group(shell.spec, "pixel_values_flat")]
    plain = shell.embed_multimodal(**inputs.combine(groups))
    noisy = dict(strategies.UNRELATED_KWARGS, **inputs.combine(groups))
    noisy["input_ids"] = torch.arange(7)
    noisy["positions"] = torch.arange(7)
    assert_close_tensors(shell.embed_multimodal(**noisy), plain, "with unrelated kwargs")


@pytest.mark.parametrize("modality", ["images", "videos"])
def test_both_forms_of_one_modality_are_not_silently_dropped(shell, modality):
    """Pixels and embeddings of the same modality in one call: either both give outputs, or a
    clear error names them. Dropping one form silently is the failure."""
    spec = shell.spec
    if modality == "images":
        groups = [one_group(spec, "image_embeds"), one_group(spec, "pixel_values_flat")]
    else:
        groups = [one_group(spec, "video_embeds"), one_group(spec, "pixel_values_flat_video")]
    try:
        out = shell.embed_multimodal(**inputs.combine(groups))
    except Exception as exc:
        assert_clear_error(exc, [g.form for g in groups])
        return
    assert len(out) == sum(g.num_items for g in groups), (
        f"{len(out)} outputs for {sum(g.num_items for g in groups)} items: "
        "one form was silently dropped"
    )


@pytest.mark.parametrize(
    ("form", "missing"),
    [
        ("pixel_values_flat", "image_num_patches"),
        ("pixel_values_flat_video", "video_num_patches"),
        ("input_audio_features", "feature_attention_mask"),
        ("input_audio_features", "audio_num_clips"),
    ],
)
def test_incomplete_inputs_raise_a_clear_error(shell, form, missing):
    group = one_group(shell.spec, form)
    kwargs = {k: v for k, v in group.kwargs.items() if k != missing}
    with raises_clear_error(missing):
        shell.embed_multimodal(**kwargs)


VARIANTS = {
    # The contract every target must meet: no None-valued keys, equal-length embedding lists.
    "core": {"ragged": False, "none_keys": False},
    "ragged-lists": {"ragged": True, "none_keys": False},
    "none-keys": {"ragged": False, "none_keys": True},
}


@pytest.mark.parametrize("variant", VARIANTS)
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # a factory: new shell each
@given(data=st.data())
def test_nothing_is_silently_dropped(make_shell, variant, data):
    """Any subset of modalities, forms, item counts, key orders and unrelated keys: every
    provided item yields an output (matching what its group gives alone, in first-key order),
    or the call raises a clear error naming a provided key."""
    shell = make_shell()
    request = data.draw(strategies.requests(shell.spec, **VARIANTS[variant]), label="request")
    try:
        out = shell.embed_multimodal(**request.kwargs)
    except Exception as exc:
        assert is_clear_error(exc, [g.form for g in request.groups]), (
            f"unclear error for forms {[g.form for g in request.groups]}: "
            f"{type(exc).__name__}: {exc}"
        )
        return
    assert len(out) == request.num_items, (
        f"{request.num_items} items, {len(out)} outputs for {[g.form for g in request.groups]}"
    )
    expected = [t for g in request.groups for t in shell.embed_multimodal(**g.kwargs)]
    assert_close_tensors(out, expected, "outputs")
