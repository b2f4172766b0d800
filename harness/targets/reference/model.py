"""The reference model of a checkpoint folder as the suites drive it: its towers' calls recorded,
served with a serving configuration's options."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import torch

from harness.checkpoints.serving import ServingConfig
from harness.checkpoints.spec import ModelSpec
from harness.inputs.requests import ItemFeatures, ProcessedRequest, Request, RequestResult
from harness.targets.base import EncoderCalls, MultimodalModel, ParsedModality
from harness.targets.reference import requests
from reference_impl.model import (
    NanoNemotronVLForConditionalGeneration,
    NanoNemotronVLModel,
    merge_multimodal_embeddings,
)

_T = TypeVar("_T")


class Answers(Protocol):
    """Where the reference, as the oracle of another target's checks, keeps its answers
    (:class:`harness.oracles.cache.OracleCache`): ``compute()``'s value for a question about
    ``inputs``, computed once."""

    def answer(self, question: str, inputs: tuple[object, ...], compute: Callable[[], _T]) -> _T:
        """``compute()``'s value, or the one kept for the same question and inputs."""


class ReferenceModel(MultimodalModel):
    """The reference model of a checkpoint folder (fp32 unless served in another dtype), its
    towers' calls recorded.

    As an oracle, its answers about requests may be kept in ``answers``; then the folder is
    loaded (``load``) only when a question is not answered there, so a run whose answers were
    all kept loads no model."""

    def __init__(
        self,
        load: Callable[[], NanoNemotronVLForConditionalGeneration],
        spec: ModelSpec,
        serving: ServingConfig,
        device: torch.device,
        dtype: torch.dtype,
        answers: Answers | None = None,
    ) -> None:
        super().__init__(spec, EncoderCalls(), device, dtype, serving)
        self.answers = answers
        self._load = load
        self._loaded: NanoNemotronVLForConditionalGeneration | None = None
        if answers is None:
            self._loaded_model()

    @property
    def model(self) -> NanoNemotronVLForConditionalGeneration:
        return self._loaded_model()

    @property
    def multimodal(self) -> NanoNemotronVLModel:
        return self._loaded_model().multimodal

    def _loaded_model(self) -> NanoNemotronVLForConditionalGeneration:
        if self._loaded is not None:
            return self._loaded
        model = self._load()
        weight = model.language_model.lm_head.weight
        if (weight.device.type, weight.dtype) != (self.device.type, self.input_dtype):
            raise RuntimeError(
                f"the reference loaded on {weight.device} in {weight.dtype}, expected "
                f"{self.device} in {self.input_dtype}"
            )
        self.device = weight.device  # with its index (cuda:0)
        vision = model.multimodal.vision_model
        for method, kind in (
            ("forward_tiles", "tiles"),
            ("forward_video", "video"),
            ("forward_dynamic", "dynamic"),
        ):
            setattr(vision, method, self._recording(getattr(vision, method), kind))
        tower: Any = model.multimodal.sound_encoder  # an nn.Module (the SoundEncoder protocol)
        if tower is not None:
            tower.register_forward_pre_hook(
                lambda module, args: self.calls.audio.append(int(args[0].shape[0]))
            )
        self._loaded = model
        return model

    def _recording(self, method: Callable[..., Any], kind: str) -> Callable[..., Any]:
        @functools.wraps(method)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.calls.vision.append(kind)
            return method(*args, **kwargs)

        return recorded

    def _answer(self, question: str, request: Request, compute: Callable[[], _T]) -> _T:
        if self.answers is None or self.device.type != "cpu":
            return compute()
        return self.answers.answer(question, (self.spec, self.serving, request), compute)

    def process_request(self, request: Request) -> ProcessedRequest:
        return self._answer(
            "process_request",
            request,
            lambda: requests.prompt(self.multimodal, request, self.serving),
        )

    def run_request(self, request: Request, *, cached: bool = False) -> RequestResult:
        # The reference processor keeps no cache: cached and uncached runs are the same run.
        return self._answer(
            "run_request", request, lambda: requests.run(self.multimodal, request, self.serving)
        )

    def request_features(self, request: Request) -> list[ItemFeatures]:
        return self._answer(
            "request_features",
            request,
            lambda: requests.features(self.multimodal, request, self.serving),
        )

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
