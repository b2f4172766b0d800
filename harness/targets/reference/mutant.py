"""Regression mutants of the reference implementation: ``--target reference-mutant:NAME``.

Each puts one upstream bug class back into ``reference_impl`` (patched in the test process when
the target loads) so the harness's own tests can prove that a suite catches it. A mutant makes
its patches through the setter it is given: the target passes ``setattr``, a test passes
``monkeypatch.setattr`` so that the patches are undone after it:

- ``deepcopy-live-config``: the state helpers deep-copy the whole engine config (#38655);
- ``processor-in-metadata``: ``supports_video`` builds a processor, reconfiguring the shared
  tokenizer (#38655);
- ``lora-wrapper-on-video-markers``: video marker tokens go through the LoRA wrapper (#56231);
- ``lora-metadata-drift``: the VL class's ``embedding_modules`` differ from the LM's (#56231);
- ``contract-accepts-wrong-shape``: the static-tile pixel contract validates nothing;
- ``text-only-loads-tower-weights``: text-only loading still reads the towers' tensors (#41205);
- ``weights-kept-by-reference``: every streamed tensor kept by reference, not copied (#42244's
  class, wider than the towers it hit upstream).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from harness.targets.base import TargetLoadError
from harness.targets.reference import ReferenceTarget

#: Sets an attribute, as ``setattr(owner, name, value)`` does.
AttributeSetter = Callable[[Any, str, Any], None]


def _deepcopy_live_config(patch: AttributeSetter) -> None:
    from reference_impl import mamba_state

    def copying(engine_config: Any) -> Any:
        return copy.deepcopy(engine_config).model_config.hf_config.text_config

    patch(mamba_state, "text_config_of", copying)


#: A long prompt template (its tokenisation takes long enough for threads to overlap).
TEMPLATE = "Frame 1 sampled at 0.00 seconds: <image> describe the video. " * 100


def _processor_in_metadata(patch: AttributeSetter) -> None:
    from harness.targets.reference.target import ConfigMetadata
    from reference_impl import processor

    original = ConfigMetadata.supports_video

    def building(self: ConfigMetadata) -> bool:
        # As upstream: answering builds a processor around the tokenizer every thread shares,
        # and the construction uses that tokenizer with settings of its own: here it tokenises
        # its prompt template truncated to 2 ids. A fast tokenizer keeps truncation on the one
        # Rust object every thread shares: a thread tokenising meanwhile gets truncated ids, or
        # the tokenizer's "Already borrowed" error.
        built = self._answer(lambda: processor.NanoNemotronVLProcessor(self.config, self.tokenizer))
        tokenizer: Any = self.tokenizer  # the shared fast tokenizer
        tokenizer(TEMPLATE, truncation=True, max_length=2)
        return built is not None and original(self)

    patch(ConfigMetadata, "supports_video", building)


def _lora_wrapper_on_video_markers(patch: AttributeSetter) -> None:
    from reference_impl import model

    patch(model, "base_embedding", lambda embed: embed)


def _lora_metadata_drift(patch: AttributeSetter) -> None:
    from reference_impl.model import NanoNemotronVLForConditionalGeneration

    drifted = {"embed_tokens": "input_embeddings"}
    patch(NanoNemotronVLForConditionalGeneration, "embedding_modules", drifted)


def _contract_accepts_wrong_shape(patch: AttributeSetter) -> None:
    from reference_impl.inputs import ImagePixelInputs

    patch(ImagePixelInputs, "validate", lambda self, tile_size=None: None)


def _text_only_loads_tower_weights(patch: AttributeSetter) -> None:
    from reference_impl import checkpoint

    patch(checkpoint, "TOWER_PREFIXES", ())


def _weights_kept_by_reference(patch: AttributeSetter) -> None:
    from reference_impl import checkpoint

    patch(checkpoint, "copy_streamed", lambda tensor: tensor)


REFERENCE_MUTANTS: dict[str, Callable[[AttributeSetter], None]] = {
    "deepcopy-live-config": _deepcopy_live_config,
    "processor-in-metadata": _processor_in_metadata,
    "lora-wrapper-on-video-markers": _lora_wrapper_on_video_markers,
    "lora-metadata-drift": _lora_metadata_drift,
    "contract-accepts-wrong-shape": _contract_accepts_wrong_shape,
    "text-only-loads-tower-weights": _text_only_loads_tower_weights,
    "weights-kept-by-reference": _weights_kept_by_reference,
}


class ReferenceMutantTarget(ReferenceTarget):
    """The reference with one upstream bug put back (patched when the target loads)."""

    deviations_name = "reference"

    def __init__(self, mutant: str) -> None:
        super().__init__()
        if mutant not in REFERENCE_MUTANTS:
            raise TargetLoadError(
                f"reference-mutant: expected one of {sorted(REFERENCE_MUTANTS)}, got {mutant!r}"
            )
        self.mutant = mutant
        self._applied = False

    @property
    def name(self) -> str:
        return f"reference-mutant:{self.mutant}"

    def load(self) -> object:
        if not self._applied:
            REFERENCE_MUTANTS[self.mutant](setattr)
            self._applied = True
        return None
