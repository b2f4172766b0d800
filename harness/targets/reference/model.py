"""The reference model of a checkpoint folder as the suites drive it: its towers' calls recorded,
served with a serving configuration's options."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from harness.checkpoints.serving import DEFAULT_SERVING, ServingConfig
from harness.checkpoints.spec import ModelSpec
from harness.inputs.requests import ItemFeatures, ProcessedRequest, Request, RequestResult
from harness.targets.base import EncoderCalls, MultimodalModel, ParsedModality
from harness.targets.reference import requests
from reference_impl.model import (
    NanoNemotronVLForConditionalGeneration,
    NanoNemotronVLModel,
    merge_multimodal_embeddings,
)


class ReferenceModel(MultimodalModel):
    """The reference model of a checkpoint folder (fp32 unless served in another dtype), its
    towers' calls recorded."""

    def __init__(
        self,
        model: NanoNemotronVLForConditionalGeneration,
        spec: ModelSpec,
        serving: ServingConfig = DEFAULT_SERVING,
    ) -> None:
        calls = EncoderCalls()
        weight = model.language_model.lm_head.weight
        super().__init__(spec, calls, weight.device, weight.dtype, serving)
        self.model = model
        self.multimodal: NanoNemotronVLModel = model.multimodal
        vision = self.multimodal.vision_model
        for method, kind in (
            ("forward_tiles", "tiles"),
            ("forward_video", "video"),
            ("forward_dynamic", "dynamic"),
        ):
            setattr(vision, method, self._recording(getattr(vision, method), kind))
        tower: Any = self.multimodal.sound_encoder  # an nn.Module (the SoundEncoder protocol)
        if tower is not None:
            tower.register_forward_pre_hook(
                lambda module, args: self.calls.audio.append(int(args[0].shape[0]))
            )

    def _recording(self, method: Callable[..., Any], kind: str) -> Callable[..., Any]:
        @functools.wraps(method)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.calls.vision.append(kind)
            return method(*args, **kwargs)

        return recorded

    def process_request(self, request: Request) -> ProcessedRequest:
        return requests.prompt(self.multimodal, request, self.serving)

    def run_request(self, request: Request, *, cached: bool = False) -> RequestResult:
        # The reference processor keeps no cache: cached and uncached runs are the same run.
        return requests.run(self.multimodal, request, self.serving)

    def request_features(self, request: Request) -> list[ItemFeatures]:
        return requests.features(self.multimodal, request, self.serving)

    def connect(self, features: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        with torch.no_grad():
            out: torch.Tensor = self.multimodal.connector(
                features.to(self.device, self.input_dtype), grid
            )
        return out

    def _merge(
        self, ids: torch.Tensor, embeddings: list[torch.Tensor], is_multimodal: torch.Tensor
    ) -> torch.Tensor:
        text = self.model.language_model.embed_input_ids(ids)
        return merge_multimodal_embeddings(text, embeddings, is_multimodal)

    def _parse(self, **kwargs: object) -> dict[str, ParsedModality]:
        parsed = self.multimodal.parse_multimodal_inputs(**kwargs)
        normalised: dict[str, ParsedModality] = {}
        for modality in parsed:
            inputs = parsed[modality]  # type: ignore[literal-required]  # keys of the TypedDict
            normalised[modality] = ParsedModality(inputs.kind, inputs.num_items)
        return normalised

    def _embed(
        self, placeholder_counts: list[int] | None, **kwargs: object
    ) -> tuple[torch.Tensor, ...]:
        return self.multimodal.embed_multimodal(placeholder_counts=placeholder_counts, **kwargs)
