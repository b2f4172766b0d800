"""A user's request through the reference: the engine's refusals a serving configuration sets
(:func:`admit`), its processor, the engine's admission of the prompt (:func:`admit_prompt`, the
context; for a run, as vLLM's engine admits a request after its processor), then
``embed_multimodal`` once per modality (the reference has no batching of its own to model)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from harness.checkpoints.serving import DEFAULT_SERVING, ServingConfig
from harness.inputs.requests import (
    AudioClip,
    Batch,
    ItemFeatures,
    ProcessedRequest,
    Request,
    RequestItem,
    RequestResult,
    VideoClip,
    VideoFile,
    audio_decode_cap_s,
    audio_with_rate,
)
from harness.targets.base import PROCESSOR_FLOAT_KEYS, NotImplementedByTarget
from reference_impl.errors import ConfigError
from reference_impl.metadata import MODEL_INPUT_KEYS
from reference_impl.model import NanoNemotronVLModel
from reference_impl.processor import NanoNemotronVLProcessor, ProcessorOutput, Video
from reference_impl.resample import resample

#: The reference processor's modality names.
PROCESSOR_MODALITY = {"images": "image", "videos": "video", "audios": "audio"}


def _image(item: Any, index: int) -> np.ndarray:
    if isinstance(item, np.ndarray):
        return item
    convert = getattr(item, "convert", None)
    if convert is None:
        raise ConfigError(
            f"images[{index}]", "a PIL image or an [H, W, 3] uint8 array", type(item).__name__
        )
    return np.asarray(convert("RGB"))


def _video(item: Any, index: int) -> Video:
    if not isinstance(item, VideoClip):
        raise ConfigError(f"videos[{index}]", "a VideoClip", type(item).__name__)
    data = item.data if isinstance(item, VideoFile) else None
    return Video(torch.from_numpy(item.frames.copy()), item.fps, item.frames_indices, data)


def _audio(item: Any, index: int) -> torch.Tensor:
    if isinstance(item, AudioClip):  # the loader's step (at_the_model_rate) comes first
        raise ConfigError(
            f"audios[{index}]",
            "samples at the model's rate (an AudioClip is resampled by the loader first)",
            f"an AudioClip at {item.rate} Hz",
        )
    return torch.as_tensor(np.asarray(item, dtype=np.float32))


def process(processor: NanoNemotronVLProcessor, request: Request) -> ProcessorOutput:
    """The reference processor on a request."""
    image_embeds = request.embeddings("image")
    video_embeds = request.embeddings("video")
    images = [] if image_embeds is not None else list(request.images)
    videos = [] if video_embeds is not None else list(request.videos)
    return processor(
        request.prompt,
        images=[_image(item, i) for i, item in enumerate(images)],
        videos=[_video(item, i) for i, item in enumerate(videos)],
        audios=[_audio(item, i) for i, item in enumerate(request.audios)],
        image_embeds=image_embeds or (),
        video_embeds=video_embeds or (),
        audio_in_video=request.audio_in_video,
        max_num_tiles=request.max_num_tiles,
    )


def at_the_model_rate(model: NanoNemotronVLModel, request: Request) -> Request:
    """``request`` with every audio item as the engine's audio loader hands it on: mono samples
    at the model's sampling rate (``sound_config.sampling_rate``), resampled from the item's
    rate by band-limited interpolation (:func:`reference_impl.resample.resample`, the
    interpolation vLLM's loader runs). A model without an audio tower keeps the items, which its
    processor refuses."""
    sound = model.config.sound_config
    if sound is None or not request.audios:
        return request
    audios = []
    for index, item in enumerate(request.audios):
        samples, rate = audio_with_rate(item)
        if rate == sound.sampling_rate:
            audios.append(samples)
            continue
        try:
            mono = torch.as_tensor(np.asarray(samples, dtype=np.float32))
        except (TypeError, ValueError) as e:
            raise ConfigError(
                f"audios[{index}]", "mono float samples", type(samples).__name__
            ) from e
        audios.append(resample(mono, rate, sound.sampling_rate).numpy())
    return dataclasses.replace(request, audios=audios)


def admit(serving: ServingConfig, request: Request) -> None:
    """The engine's refusals of a request before its processor runs: embeddings without
    ``--enable-mm-embeds``, more items of a modality than ``--limit-mm-per-prompt`` allows."""
    given = [m for m in ("image", "video") if request.embeddings(m) is not None]
    if given and not serving.enable_mm_embeds:
        raise ConfigError(
            "enable_mm_embeds",
            f"True (--enable-mm-embeds) for a request with {given[0]} embeddings",
            False,
        )
    for modality, limit in serving.limits().items():
        # An audio track taken from a video (use_audio_in_video) is an audio item too.
        count = request.expected_items(modality)  # type: ignore[arg-type]  # LIMITED_MODALITIES
        if count > limit:
            raise ConfigError(
                f"limit_mm_per_prompt.{modality}",
                f"at most {limit} {modality} item(s) in one prompt (--limit-mm-per-prompt)",
                count,
            )


def loaded(serving: ServingConfig, request: Request) -> Request:
    """``request`` as the engine's media loaders make it under ``--media-io-kwargs``: video
    files sampled to ``num_frames`` (the one loader option the reference implements)."""
    options = dict(serving.media_io())
    video = dict(options.pop("video", {}))
    num_frames = video.pop("num_frames", None)
    if options or video:
        raise NotImplementedByTarget(
            f"--media-io-kwargs: the reference loads video files with num_frames only, got "
            f"{serving.text('media_io_kwargs')}"
        )
    if num_frames is None:
        return request
    if not isinstance(num_frames, int):
        raise ConfigError("media_io_kwargs.video.num_frames", "an int", num_frames)
    videos = [v.sampled(num_frames) if isinstance(v, VideoFile) else v for v in request.videos]
    return dataclasses.replace(request, videos=videos)


def processed(
    model: NanoNemotronVLModel, request: Request, serving: ServingConfig
) -> ProcessorOutput:
    """The request through the reference processor as the engine admits and loads it."""
    admit(serving, request)
    request = loaded(serving, request)
    request = at_the_model_rate(model, request)
    # The engine's audio decode cap, read at each request as vLLM reads it at each decode.
    config = dataclasses.replace(model.config, max_audio_duration_s=audio_decode_cap_s())
    return process(NanoNemotronVLProcessor(config, model.tokenizer), request)


def admit_prompt(model: NanoNemotronVLModel, processed: ProcessorOutput) -> None:
    """The engine's admission of a processed prompt: it and at least one generated token must
    fit the context (``--max-model-len``)."""
    context = model.config.max_model_len
    if len(processed.input_ids) >= context:
        raise ConfigError(
            "max_model_len",
            f"a processed prompt of at most {context - 1} tokens, leaving one for the output "
            "(--max-model-len)",
            len(processed.input_ids),
        )


def _items(processed: ProcessorOutput) -> list[RequestItem]:
    return [
        RequestItem(
            PROCESSOR_MODALITY[span.modality],
            span.index,
            tuple(range(span.start, span.start + span.length)),
        )
        for span in sorted(processed.placeholders, key=lambda p: p.start)
    ]


def prompt(
    model: NanoNemotronVLModel, request: Request, serving: ServingConfig = DEFAULT_SERVING
) -> ProcessedRequest:
    """The request through the reference processor alone."""
    output = processed(model, request, serving)
    return ProcessedRequest(output.input_ids, _items(output))


def run(
    model: NanoNemotronVLModel, request: Request, serving: ServingConfig = DEFAULT_SERVING
) -> RequestResult:
    """The request through the reference processor and model."""
    output = processed(model, request, serving)
    admit_prompt(model, output)
    dtype = next(model.connector.parameters()).dtype
    embedded: dict[tuple[str, int], torch.Tensor] = {}
    batches: list[Batch] = []
    with torch.no_grad():
        for modality, keys in MODEL_INPUT_KEYS.items():
            # The processor's floating features in the model's dtype, as an engine casts them.
            kwargs = {
                k: _cast(v, dtype) if k in PROCESSOR_FLOAT_KEYS else v
                for k, v in output.mm_kwargs.items()
                if k in keys
            }
            if not kwargs:
                continue
            outputs = [
                out for _, items in model.embed_by_modality(**kwargs).values() for out in items
            ]
            batches.append(Batch.of(modality, len(outputs), kwargs))
            embedded.update(((modality, i), out) for i, out in enumerate(outputs))
    items = _items(output)
    embeddings = [embedded[(item.modality, item.index)] for item in items]
    return RequestResult(output.input_ids, items, embeddings, batches)


def _cast(value: object, dtype: torch.dtype) -> object:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(dtype)
    if isinstance(value, list):  # dynamic resolution: one tensor per image
        return [_cast(v, dtype) for v in value]
    return value


#: Each modality's per-item features and the count that splits them into items (dynamic
#: resolution's pixels come as a list, one entry per image, and need no split).
_ITEM_FEATURES: dict[str, tuple[tuple[str, ...], str]] = {
    "image": (("pixel_values_flat",), "image_num_patches"),
    "video": (("pixel_values_flat_video",), "video_num_patches"),
    "audio": (("input_audio_features", "feature_attention_mask"), "audio_num_clips"),
}


def features(
    model: NanoNemotronVLModel, request: Request, serving: ServingConfig = DEFAULT_SERVING
) -> list[ItemFeatures]:
    """The reference processor's features of each media item, in prompt order."""
    output = processed(model, request, serving)
    kwargs = output.mm_kwargs
    per_item: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
    for modality, (keys, count_key) in _ITEM_FEATURES.items():
        for key in keys:
            value = kwargs.get(key)
            if value is None:
                continue
            if isinstance(value, list):  # dynamic resolution: one tensor per image
                parts = list(value)
            else:
                counts = kwargs[count_key]
                assert isinstance(value, torch.Tensor)
                assert isinstance(counts, list | torch.Tensor), f"{count_key}: {counts!r}"
                parts = list(torch.split(value, [int(n) for n in counts]))
            for index, part in enumerate(parts):
                per_item.setdefault((modality, index), {})[key] = part
    return [
        ItemFeatures(item.modality, item.index, per_item[(item.modality, item.index)])
        for item in _items(output)
        if (item.modality, item.index) in per_item
    ]
