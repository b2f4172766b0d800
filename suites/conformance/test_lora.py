"""LoRA's class metadata (vLLM PR #56231), on every target: the multimodal class supports LoRA
and carries exactly its language model's LoRA metadata (copies that drift would map adapters
wrongly). Adapters served through the target's LoRA machinery: ``test_lora_adapters.py``.
"""

from __future__ import annotations

import pytest

from harness.targets.base import LORA_ATTRIBUTES

pytestmark = pytest.mark.concern("lora-metadata")


@pytest.mark.self_consistency(
    "the class's declared LoRA interface: vLLM's supports_lora of the class (its SupportsLoRA "
    "mixin), the reference's declared by hand; adapters served: test_lora_adapters.py"
)
def test_the_multimodal_class_supports_lora(target):
    assert target.lora_metadata().supports_lora


@pytest.mark.self_consistency(
    "the multimodal class's LoRA metadata against its own language model's: one object under "
    "two names in the installed vLLM; it fails where a file copies the metadata and the copy "
    "drifts (vLLM PR #56231; the corpus's lora-metadata-drift mutant)"
)
@pytest.mark.parametrize("attribute", LORA_ATTRIBUTES)
def test_lora_metadata_equals_the_language_models(target, attribute):
    metadata = target.lora_metadata()
    assert metadata.multimodal[attribute] == metadata.language_model[attribute], (
        f"{attribute}: multimodal {metadata.multimodal[attribute]!r}, "
        f"language model {metadata.language_model[attribute]!r}"
    )
    assert metadata.multimodal[attribute] is not None
