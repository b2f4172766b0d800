"""A user's request through vLLM, as its engine runs it, on CPU.

The steps and the vLLM objects that do them:

1. the renderer: ``MULTIMODAL_REGISTRY.create_processor(model_config)`` (the processor vLLM's
   registry makes for the checkpoint folder), ``processor.info.parse_mm_data`` (its data parser),
   then the processor on the prompt (tokenised as the processor's defaults say) and the parsed
   items, with or without vLLM's processor-only cache;
2. the engine's admission: ``InputProcessor.process_inputs`` on the processed prompt (its checks
   of the prompt against ``--max-model-len`` and of the request against the platform); then the
   engine core boundary: every item's kwargs through vLLM's msgpack encoder and decoder, in
   prompt order (the engine sorts a request's items by placeholder offset);
3. the model runner's encoder step: ``group_and_batch_mm_kwargs`` groups consecutive items,
   videos one at a time where the model sets ``requires_sequential_video_encoding``, then
   ``embed_multimodal`` per batch under the engine config, then vLLM's
   ``sanity_check_mm_encoder_outputs``.

The scheduler's placement of each output into its placeholder is the one step not run: the
result gives each item's placeholder positions (``PlaceholderRange`` offset and ``is_embed``)
next to its embedding, and the suites check they agree.
"""

from __future__ import annotations

import base64
import functools
from typing import Any

import torch

from harness.inputs.requests import (
    Batch,
    ItemFeatures,
    ProcessedRequest,
    Request,
    RequestItem,
    RequestResult,
    VideoClip,
    VideoFile,
    audio_with_rate,
)
from harness.numerics import Numerics, current_numerics
from harness.targets.vllm.runtime import prepare_cpu_environment

#: The processor's pixel outputs (uint8 where the model normalises them on its device).
PIXEL_KEYS = ("pixel_values_flat", "pixel_values_flat_video")
#: The processor outputs a tower reads as features (floating) and their masks.
FEATURE_KEYS = (
    "pixel_values_flat",
    "pixel_values_flat_video",
    "input_audio_features",
    "feature_attention_mask",
)


# ---------------------------------------------------------------------------------------------
# A request in vLLM's wire form


def video_metadata(video: VideoClip) -> dict[str, object]:
    """vLLM's video metadata for a clip's frames (``video_needs_metadata``); a file's carries its
    bytes as vLLM's ``nemotron_vl`` video loader keeps them (``original_video_bytes``), for a
    request that asks for the file's audio track too."""
    total = max(video.frames_indices) + 1
    metadata: dict[str, object] = {
        "fps": video.fps,
        "frames_indices": list(video.frames_indices),
        "total_num_frames": total,
        "duration": total / video.fps,
        "video_backend": "opencv",
    }
    if isinstance(video, VideoFile):
        metadata["original_video_bytes"] = video.data
    return metadata


def multi_modal_data(request: Request) -> dict[str, object]:
    """vLLM's ``multi_modal_data`` for a request: images as given, video frames with their
    metadata, audio with its sample rate; embeddings as given."""
    data: dict[str, object] = {}
    if request.num_items("image"):
        data["image"] = request.images
    if request.num_items("video"):
        videos = request.videos
        data["video"] = (
            videos
            if request.embeddings("video") is not None
            else [(clip.frames, video_metadata(clip)) for clip in videos]
        )
    if request.num_items("audio"):
        data["audio"] = [audio_with_rate(audio) for audio in request.audios]
    return data


def processor_kwargs(request: Request) -> dict[str, object]:
    """vLLM's per-request ``mm_processor_kwargs`` for a request."""
    kwargs: dict[str, object] = {}
    if request.audio_in_video:
        kwargs["use_audio_in_video"] = True
    if request.max_num_tiles is not None:
        kwargs["max_num_tiles"] = request.max_num_tiles
    return kwargs


def video_replacement_ids(
    tokenizer: Any,
    tokens_per_frame: list[int],
    frames_indices: list[int],
    frame_duration_ms: int | None,
    temporal_patch_size: int,
    processor_cls: Any = None,
) -> list[int]:
    """``NanoNemotronVLProcessor.get_video_repl`` token ids, with ``tokenizer``: the installed
    vLLM's processor class, or ``processor_cls`` (a target's, from the file under test)."""
    prepare_cpu_environment()
    from vllm.transformers_utils.processors.nano_nemotron_vl import (
        IMG_CONTEXT,
        IMG_END,
        IMG_START,
        NanoNemotronVLProcessor,
    )

    def encode(text: str) -> list[int]:
        ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
        return ids

    details = (processor_cls or NanoNemotronVLProcessor).get_video_repl(
        tokens_per_frame=tokens_per_frame,
        frames_indices=frames_indices,
        frame_duration_ms=frame_duration_ms,
        tokenizer=tokenizer,
        img_start_token_ids=encode(IMG_START),
        img_end_token_ids=encode(IMG_END),
        img_context_token_ids=encode(IMG_CONTEXT),
        video_temporal_patch_size=temporal_patch_size,
    )
    return list(details.full)


class VllmRequestPath:
    """The request path of one built model: its processor and processor cache made once."""

    def __init__(self, model: Any, vllm_config: Any) -> None:
        from vllm.multimodal import MULTIMODAL_REGISTRY
        from vllm.multimodal.cache.base import MultiModalProcessorOnlyCache

        self.model = model
        self.vllm_config = vllm_config
        model_config = vllm_config.model_config
        self.processor = MULTIMODAL_REGISTRY.create_processor(model_config)
        # One processor cache per numerics: an item's cached features are compared bit for bit
        # with a fresh processing's (suites/conformance/test_requests.py), and an audio clip's
        # log-mel features come from products whose rounding may follow the thread count.
        self._caches: dict[Numerics, Any] = {}
        self._new_cache = functools.partial(MultiModalProcessorOnlyCache, model_config)

    @property
    def cache(self) -> Any:
        """vLLM's processor cache for the numerics in force (:mod:`harness.numerics`)."""
        numerics = current_numerics()
        if numerics not in self._caches:
            self._caches[numerics] = self._new_cache()
        return self._caches[numerics]

    def multi_modal_data(self, request: Request) -> dict[str, object]:
        """The request's ``multi_modal_data`` as the server makes it. Video files are decoded
        as the harness's loader decodes them (:class:`~harness.inputs.requests.VideoFile`), unless
        the engine is served with ``--media-io-kwargs`` for video: then each file's bytes are loaded
        by vLLM's ``MediaConnector`` with the engine's loader options, as the chat parser loads
        a ``video_url``."""
        data = multi_modal_data(request)
        io_kwargs = self.vllm_config.model_config.multimodal_config.media_io_kwargs or {}
        options = set(io_kwargs.get("video", {})) - {"video_backend"}  # the model's own
        files = request.embeddings("video") is None and any(
            isinstance(video, VideoFile) for video in request.videos
        )
        if not options or not files:
            return data
        from vllm.multimodal.media import MediaConnector

        connector = MediaConnector(media_io_kwargs=io_kwargs)
        data["video"] = [
            connector.fetch_video(
                "data:video/x-matroska;base64," + base64.b64encode(video.data).decode()
            )
            if isinstance(video, VideoFile)
            else (video.frames, video_metadata(video))
            for video in request.videos
        ]
        return data

    def process(self, request: Request, *, cached: bool = False) -> Any:
        """The renderer's step: vLLM's ``MultiModalInput`` for the request."""
        items = self.processor.info.parse_mm_data(self.multi_modal_data(request))
        return self.processor(
            request.prompt,
            items,
            hf_processor_mm_kwargs=processor_kwargs(request),
            cache=self.cache if cached else None,
        )

    @functools.cached_property
    def input_processor(self) -> Any:
        """vLLM's ``InputProcessor`` for the engine config, as ``LLMEngine`` and ``AsyncLLM``
        make it."""
        from vllm.v1.engine.input_processor import InputProcessor

        return InputProcessor(self.vllm_config)

    def admit(self, processed: Any) -> None:
        """The engine's admission of a processed request: ``process_inputs`` with one output
        token asked for (raises what it raises: a prompt longer than the context)."""
        from vllm import SamplingParams

        self.input_processor.process_inputs(
            "harness-request",
            processed,
            SamplingParams(max_tokens=1),
            supported_tasks=("generate",),
        )

    @functools.cached_property
    def uncast_processor(self) -> Any:
        """Another processor vLLM's registry makes for the same config, with the one step of
        its processing context that casts floating outputs to the model's dtype
        (``_postprocess_output``, which also moves tensors to the CPU, where they are already)
        left out: its features are the HF processor's, in fp32. Its context is its own."""
        from vllm.multimodal import MULTIMODAL_REGISTRY

        processor = MULTIMODAL_REGISTRY.create_processor(self.vllm_config.model_config)
        context = processor.info.ctx
        assert context is not self.processor.info.ctx, "the registry shared a processing context"
        # The context is a frozen dataclass.
        object.__setattr__(context, "_postprocess_output", lambda output: output)
        return processor

    def features(self, request: Request) -> list[ItemFeatures]:
        """The processor's features of each media item, in prompt order, before the cast."""
        processor = self.uncast_processor
        items = processor.info.parse_mm_data(self.multi_modal_data(request))
        processed = processor(
            request.prompt, items, hf_processor_mm_kwargs=processor_kwargs(request)
        )
        found = []
        for _, modality, index, _ in _in_prompt_order(processed):
            item = processed["mm_kwargs"][modality][index]
            tensors = {
                key: self.as_the_tower_reads(key, item[key].data)
                for key in FEATURE_KEYS
                if key in item
            }
            if tensors:
                found.append(ItemFeatures(modality, index, tensors))
        return found

    def as_the_tower_reads(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        """A feature as the model's tower reads it. Where the model normalises pixels on its
        device (vLLM 0.34.0 on: ``mm_device_do_normalize``, on by default for this model), the
        processor hands over the resized pixels as uint8 and the model's ``input_norm``
        (``FusedMMInputNorm`` over the config's ``norm_mean`` / ``norm_std``, computing in fp32,
        per channel) makes them the tower's input: that same layer, run here in fp32 on the
        processor's output, gives what the earlier releases' processor gave."""
        if key not in PIXEL_KEYS or tensor.dtype != torch.uint8:
            return tensor
        from vllm.model_executor.layers.fusion.mm_input_norm import FusedMMInputNorm

        config = self.vllm_config.model_config.hf_config
        norm = FusedMMInputNorm(
            image_mean=list(config.norm_mean),
            image_std=list(config.norm_std),
            rescale_factor=1.0 / 255.0,
            layout="bchw",
        )
        # Tiles and frames are [n, C, H, W], a dynamic-resolution image [C, H, W]: the channel
        # is the third axis from the end in both.
        images = tensor.reshape(-1, *tensor.shape[-3:])
        normalised: torch.Tensor = norm.forward_native(images, torch.float32)
        return normalised.reshape(tensor.shape)

    def prompt(self, request: Request) -> ProcessedRequest:
        processed = self.process(request)
        items = [
            RequestItem(modality, index, _embed_positions(placeholder))
            for _, modality, index, placeholder in _in_prompt_order(processed)
        ]
        return ProcessedRequest(list(processed["prompt_token_ids"]), items)

    def run(self, request: Request, *, cached: bool = False) -> RequestResult:
        from vllm.config import set_current_vllm_config
        from vllm.multimodal.inputs import MultiModalKwargsItem
        from vllm.multimodal.utils import group_and_batch_mm_kwargs
        from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder
        from vllm.v1.worker.utils import sanity_check_mm_encoder_outputs

        processed = self.process(request, cached=cached)
        self.admit(processed)
        features = _in_prompt_order(processed)

        encoder, decoder = MsgpackEncoder(), MsgpackDecoder(MultiModalKwargsItem)
        kwargs = [
            (modality, decoder.decode(encoder.encode(processed["mm_kwargs"][modality][index])))
            for _, modality, index, _ in features
        ]
        sequential_videos = getattr(self.model, "requires_sequential_video_encoding", False)
        batches: list[Batch] = []
        outputs: list[torch.Tensor] = []
        done = 0  # items embedded so far
        with set_current_vllm_config(self.vllm_config), torch.no_grad():
            for modality, num_items, batch in group_and_batch_mm_kwargs(kwargs):
                if sequential_videos and modality == "video" and num_items > 1:
                    for one in kwargs[done : done + num_items]:
                        _, _, single = next(group_and_batch_mm_kwargs([one]))
                        out = self.model.embed_multimodal(**single)
                        sanity_check_mm_encoder_outputs(out, expected_num_items=1)
                        batches.append(Batch.of(modality, 1, single))
                        outputs.extend(out)
                    done += num_items
                    continue
                out = self.model.embed_multimodal(**batch)
                sanity_check_mm_encoder_outputs(out, expected_num_items=num_items)
                batches.append(Batch.of(modality, num_items, batch))
                outputs.extend(out)
                done += num_items
        items = [
            RequestItem(modality, index, _embed_positions(placeholder))
            for _, modality, index, placeholder in features
        ]
        return RequestResult(list(processed["prompt_token_ids"]), items, outputs, batches)


def _in_prompt_order(processed: Any) -> list[tuple[int, str, int, Any]]:
    """``(offset, modality, index, PlaceholderRange)`` of every item, sorted by offset as the
    engine orders a request's items."""
    features = [
        (placeholder.offset, modality, index, placeholder)
        for modality, placeholders in processed["mm_placeholders"].items()
        for index, placeholder in enumerate(placeholders)
    ]
    return sorted(features, key=lambda feature: feature[0])


def _embed_positions(placeholder: Any) -> tuple[int, ...]:
    """The prompt positions a ``PlaceholderRange``'s embedding rows fill."""
    offsets = range(placeholder.offset, placeholder.offset + placeholder.length)
    if placeholder.is_embed is None:
        return tuple(offsets)
    mask = placeholder.is_embed.tolist()
    return tuple(position for position, embed in zip(offsets, mask, strict=True) if embed)
