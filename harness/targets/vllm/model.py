"""vLLM's ``NemotronH_Nano_VL_V2`` built from a checkpoint folder, as the suites drive it.

The towers are vLLM's own (``RadioModel``, ``mlp1``, ``ProjectedParakeet``); forward pre-hooks
record each call into :class:`EncoderCalls` without changing what runs.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from harness.checkpoints.serving import DEFAULT_SERVING, ServingConfig
from harness.checkpoints.spec import ModelSpec
from harness.inputs.requests import ItemFeatures, ProcessedRequest, Request, RequestResult
from harness.targets.base import EncoderCalls, MultimodalModel, ParsedModality
from harness.targets.vllm.requests import VllmRequestPath


class VllmModel(MultimodalModel):
    def __init__(
        self,
        model: Any,
        vllm_config: Any,
        spec: ModelSpec,
        serving: ServingConfig = DEFAULT_SERVING,
        *,
        shares: VllmModel | None = None,
    ) -> None:
        """``shares``: another wrapper of the same built ``model`` (a configuration whose
        options act on requests only): its recorded calls are this one's too."""
        calls = EncoderCalls() if shares is None else shares.calls
        # What the engine casts the processor's floating outputs to: the served dtype.
        dtype = vllm_config.model_config.dtype
        super().__init__(spec, calls, torch.device("cpu"), dtype, serving)
        self.model = model
        self.vllm_config = vllm_config
        if shares is None:
            model.vision_model.register_forward_pre_hook(self._record_vision, with_kwargs=True)
            if model.sound_encoder is not None:
                model.sound_encoder.register_forward_pre_hook(self._record_audio)
        self._request_path: VllmRequestPath | None = None

    @property
    def request_path(self) -> VllmRequestPath:
        if self._request_path is None:
            self._request_path = VllmRequestPath(self.model, self.vllm_config)
        return self._request_path

    def process_request(self, request: Request) -> ProcessedRequest:
        return self.request_path.prompt(request)

    def run_request(self, request: Request, *, cached: bool = False) -> RequestResult:
        return self.request_path.run(request, cached=cached)

    def request_features(self, request: Request) -> list[ItemFeatures]:
        return self.request_path.features(request)

    def connect(self, features: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """vLLM's ``extract_feature`` (its pixel shuffle and ``mlp1``, the MTP layer norm where
        the checkpoint has one) on blank tiles, with the vision tower's output replaced by
        ``features`` through a forward hook."""
        n = features.shape[0]
        patch = self.spec.patch_size
        blank = torch.zeros(n, 3, grid[0] * patch, grid[1] * patch, dtype=self.input_dtype)

        def replace(module: Any, args: tuple[Any, ...], output: Any) -> Any:
            summary, patches = output
            if tuple(patches.shape) != tuple(features.shape):
                raise ValueError(
                    f"connect: features: expected the tower's shape {tuple(patches.shape)}, "
                    f"got {tuple(features.shape)}"
                )
            return summary, features.to(patches.dtype)

        handle = self.model.vision_model.register_forward_hook(replace)
        try:
            with self._current_config(), torch.no_grad():
                out: torch.Tensor = self.model.extract_feature(blank)
        finally:
            handle.remove()
        return out

    def _merge(
        self, ids: torch.Tensor, embeddings: list[torch.Tensor], is_multimodal: torch.Tensor
    ) -> torch.Tensor:
        with self._current_config():
            merged: torch.Tensor = self.model.embed_input_ids(
                ids, embeddings, is_multimodal=is_multimodal
            )
        return merged

    def _record_vision(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if kwargs.get("imgs_sizes") is not None:
            self.calls.vision.append("dynamic")
        elif kwargs.get("num_frames") is not None:
            self.calls.vision.append("video")
        else:
            self.calls.vision.append("tiles")

    def _record_audio(self, module: Any, args: tuple[Any, ...]) -> None:
        self.calls.audio.append(int(args[0].shape[0]))

    def _parse(self, **kwargs: object) -> dict[str, ParsedModality]:
        with self._current_config():
            parsed = self.model._parse_and_validate_multimodal_inputs(**kwargs)
        return {modality: _normalise(inputs) for modality, inputs in parsed.items()}

    def _embed(
        self, placeholder_counts: list[int] | None, **kwargs: object
    ) -> tuple[torch.Tensor, ...]:
        # vLLM has no placeholder-count check at this boundary: the counts are not passed.
        with self._current_config():
            return tuple(self.model.embed_multimodal(**kwargs))

    def _current_config(self) -> contextlib.AbstractContextManager[Any]:
        """The model's engine config as the current one, as in vLLM's worker."""
        from vllm.config import set_current_vllm_config

        context: contextlib.AbstractContextManager[Any] = set_current_vllm_config(self.vllm_config)
        return context


def _normalise(inputs: Any) -> ParsedModality:
    if inputs is None:
        return ParsedModality(kind="none", num_items=0)
    kind = str(inputs["type"])
    if kind in ("image_embeds", "video_embeds"):
        count = len(inputs["data"])
    elif kind == "pixel_values_dynamic":
        count = len(inputs["num_tokens_per_image"])
    elif kind == "audio_features":
        count = len(inputs["audio_num_clips"])
    else:
        count = len(inputs["num_patches"])
    return ParsedModality(kind=kind, num_items=count)
