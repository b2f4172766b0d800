"""LoRA covers the language model only (vLLM PR #56231), on every target.

- The multimodal class supports LoRA and carries exactly its language model's LoRA metadata
  (copies that drift would map adapters wrongly).
- A video's encoder-internal tokens (frame separators, ``<img>``, ``</img>``) have no entry in
  the per-token adapter mapping: they must be embedded with the wrapper's ``base_layer``. With
  a LoRA wrapper that raises when called, the video path still produces its embeddings.
"""

from __future__ import annotations

import pytest

from harness import model_kwargs
from harness.targets.base import LORA_ATTRIBUTES

pytestmark = pytest.mark.concern("lora-metadata")


def test_the_multimodal_class_supports_lora(target):
    assert target.lora_metadata().supports_lora


@pytest.mark.parametrize("attribute", LORA_ATTRIBUTES)
def test_lora_metadata_equals_the_language_models(target, attribute):
    metadata = target.lora_metadata()
    assert metadata.multimodal[attribute] == metadata.language_model[attribute], (
        f"{attribute}: multimodal {metadata.multimodal[attribute]!r}, "
        f"language model {metadata.language_model[attribute]!r}"
    )
    assert metadata.multimodal[attribute] is not None


@pytest.mark.concern("model")
@pytest.mark.parametrize("temporal", [1, 2])
def test_video_marker_tokens_use_the_base_embedding(make_model, temporal):
    model = make_model(video_temporal_patch_size=temporal)
    group = model_kwargs.video_pixels(model.spec, [3, 2])
    expected = model.embed_multimodal(**group.kwargs)
    with model.raising_lora_embedding():
        out = model.embed_multimodal(**group.kwargs)
    assert len(out) == 2
    for a, b in zip(out, expected, strict=True):
        assert a.shape == b.shape
        assert (a.float() - b.float()).abs().max() == 0
