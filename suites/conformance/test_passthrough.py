"""Precomputed-embedding pass-through (vLLM PR #56398).

``image_embeds`` and ``video_embeds``, stacked ``[n, f, h]`` or a list of ``[f_i, h]``: one output
per item, each ``torch.equal`` to its input, and no encoder call. Upstream, a stacked
``image_embeds`` crashed on tensor truthiness and ``video_embeds`` were never routed (0 outputs).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.inputs import model_kwargs
from harness.oracles.assertions import assert_same_tensors, raises_clear_error

pytestmark = pytest.mark.concern("model")

EMBED_KEYS = ("image_embeds", "video_embeds")


@pytest.mark.parametrize("key", EMBED_KEYS)
@pytest.mark.parametrize("form", ["stacked", "list"])
@pytest.mark.parametrize("num_items", [1, 2, 5])
def test_embeddings_pass_through_verbatim(model, key, form, num_items):
    group = model_kwargs.embeddings(model.spec, key, [3] * num_items, stacked=form == "stacked")
    out = model.embed_multimodal(**group.kwargs)
    assert_same_tensors(out, group.expected, key)
    assert model.calls.vision == [], "the vision encoder ran for precomputed embeddings"
    assert model.calls.audio == [], "the audio encoder ran for precomputed embeddings"


@pytest.mark.parametrize("key", EMBED_KEYS)
def test_ragged_embedding_lists_pass_through(model, key):
    """Items with different row counts (images of different sizes, videos of different lengths)
    can only come as a list; each must pass through verbatim."""
    group = model_kwargs.embeddings(model.spec, key, [3, 5, 1], stacked=False, seed=1)
    out = model.embed_multimodal(**group.kwargs)
    assert_same_tensors(out, group.expected, key)
    assert model.calls.vision == []


@pytest.mark.parametrize("key", EMBED_KEYS)
def test_embeddings_keep_their_dtype(model, key):
    group = model_kwargs.embeddings(model.spec, key, [4, 4], stacked=True, dtype=torch.bfloat16)
    out = model.embed_multimodal(**group.kwargs)
    assert_same_tensors(out, group.expected, key)


def test_the_upstream_reproducer(model):
    """PR #56398's CPU reproducer, with its own numbers: ``arange(64).reshape(2, 4, 8)``, widened
    to the model's hidden size."""
    t = torch.arange(2 * 4 * model.spec.hidden_size, dtype=torch.float32).reshape(2, 4, -1)
    for key in EMBED_KEYS:
        out = model.embed_multimodal(**{key: t})
        assert_same_tensors(out, list(t.unbind(0)), key)


@pytest.mark.parametrize(
    "order", [EMBED_KEYS, EMBED_KEYS[::-1]], ids=["image-first", "video-first"]
)
def test_image_and_video_embeddings_together_keep_key_order(model, order):
    groups = [
        model_kwargs.embeddings(model.spec, key, [2 + i] * (2 + i), stacked=i == 0, seed=i)
        for i, key in enumerate(order)
    ]
    out = model.embed_multimodal(**model_kwargs.combine(groups))
    assert_same_tensors(out, groups[0].expected + groups[1].expected, " + ".join(order))
    assert model.calls.vision == []


@pytest.mark.parametrize("key", EMBED_KEYS)
def test_embeddings_mixed_with_encoded_modalities(model, key):
    """Embeddings of one modality next to pixels / audio of others: the embeddings still come
    back verbatim, and only the other inputs reach the encoders."""
    spec = model.spec
    embeds = model_kwargs.embeddings(spec, key, [5, 5], stacked=True, seed=3)
    if key == "image_embeds":
        encoded = model_kwargs.video_pixels(spec, [2])
    else:
        encoded = model_kwargs.image_pixels(spec, [1, 2])
    audio = model_kwargs.audio_features(spec, [1, 2])
    out = model.embed_multimodal(**model_kwargs.combine([embeds, encoded, audio]))
    assert len(out) == embeds.num_items + encoded.num_items + audio.num_items
    assert_same_tensors(out[: embeds.num_items], embeds.expected, key)
    # One vision call for the other modality (T = 1 frames go through as tiles), none for ours.
    assert model.calls.vision == ["tiles"]
    assert model.calls.audio == [3]


@pytest.mark.parametrize("key", EMBED_KEYS)
def test_none_values_are_ignored(model, key):
    """A key whose value is None means "not provided", alone or next to real inputs."""
    other = "video_embeds" if key == "image_embeds" else "image_embeds"
    group = model_kwargs.embeddings(model.spec, other, [3, 3], stacked=True)
    out = model.embed_multimodal(**{key: None}, **group.kwargs)
    assert_same_tensors(out, group.expected, other)
    assert model.embed_multimodal(**{key: None}) == ()


@pytest.mark.parametrize("key", EMBED_KEYS)
def test_row_count_mismatch_rejected_at_the_boundary(model, key):
    """Beyond upstream: when the prompt's placeholder counts are known, embeddings with another
    row count are rejected where they enter, naming the input, not later in the merge."""
    group = model_kwargs.embeddings(model.spec, key, [4, 4], stacked=True)
    with raises_clear_error(key):
        model.embed_multimodal_with_counts([4, 5], **group.kwargs)


@pytest.mark.parametrize("key", EMBED_KEYS)
@pytest.mark.parametrize("form", ["stacked", "list"])
def test_hidden_size_mismatch_rejected(model, key, form):
    """Embeddings whose width is not the language model's hidden size cannot be merged; they
    must be rejected where they enter, naming the input."""
    spec = model.spec
    wrong = dataclasses.replace(spec, hidden_size=spec.hidden_size + 1)
    group = model_kwargs.embeddings(wrong, key, [3, 3], stacked=form == "stacked")
    with raises_clear_error(key):
        model.embed_multimodal(**group.kwargs)


@pytest.mark.parametrize("key", EMBED_KEYS)
def test_wrong_rank_rejected(model, key):
    t = torch.zeros(2, 3, 4, model.spec.hidden_size)
    with raises_clear_error(key):
        model.embed_multimodal(**{key: t})
