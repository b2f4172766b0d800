"""The multimodal wrapper: parse and route inputs, ``embed_multimodal``, merge into the prompt.

Glossary: ``n`` items, ``t`` static tiles, ``v`` video frames, ``g`` frame groups (frames, or
tubelets of ``T`` frames), ``k`` embedding rows per tile or group, ``c`` audio clips, ``h`` the
language model's hidden size, ``C`` the vision width.

Mirrors vLLM's ``NemotronH_Nano_VL_V2`` (``_parse_and_validate_multimodal_inputs``,
``embed_multimodal``, ``_process_video_input``, ``_create_final_video_embeddings``,
``_process_audio_input``), with the post-September-2026 behaviour: precomputed embeddings of both
images and videos are routed and passed through verbatim. Beyond upstream, every input is validated
at the boundary, both forms of one modality together are an error rather than a silent drop, and
known placeholder counts are checked against the embeddings' row counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeAlias, TypeVar

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from reference_impl.audio import ParakeetAudioTower
from reference_impl.config import VLConfig
from reference_impl.connector import Connector
from reference_impl.evs import prune
from reference_impl.inputs import (
    AudioFeatureInputs,
    ImageEmbeddingInputs,
    ImageInputs,
    ImagePixelDynamicInputs,
    ImagePixelInputs,
    InputValidationError,
    MultiModalInputs,
    VideoEmbeddingInputs,
    VideoInputs,
    VideoPixelInputs,
    describe,
    int_list,
)
from reference_impl.lora import base_embedding
from reference_impl.nemotron_h import NemotronHForCausalLM
from reference_impl.processor import Placeholder, ProcessorOutput
from reference_impl.radio import RadioVisionModel
from reference_impl.tokenizer import IMG_CONTEXT
from reference_impl.video_replacement import video_replacement_ids

# The keys that route a call to a modality. The first of them to appear (with a non-None value)
# decides where that modality sits in the output order.
IMAGE_KEYS = ("pixel_values_flat", "image_embeds")
VIDEO_KEYS = ("pixel_values_flat_video", "video_embeds")
AUDIO_KEYS = ("input_audio_features", "feature_attention_mask", "audio_num_clips")
ROUTING_KEYS: dict[str, str] = {
    **dict.fromkeys(IMAGE_KEYS, "images"),
    **dict.fromkeys(VIDEO_KEYS, "videos"),
    **dict.fromkeys(AUDIO_KEYS, "audios"),
}
# Keys that only make sense next to a routing key of the same modality.
COMPANION_KEYS: dict[str, str] = {
    "image_num_patches": "pixel_values_flat",
    "imgs_sizes": "pixel_values_flat",
    "num_tokens_per_image": "pixel_values_flat",
    "video_num_patches": "pixel_values_flat_video",
    "frames_indices": "pixel_values_flat_video",
    "frame_duration_ms": "pixel_values_flat_video",
}

MultiModalEmbeddings: TypeAlias = tuple[torch.Tensor, ...]
EmbeddingT = TypeVar("EmbeddingT", ImageEmbeddingInputs, VideoEmbeddingInputs)


class VisionTower(Protocol):
    """What the wrapper needs of a vision tower (RADIO, or a test double)."""

    def forward_tiles(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``[n, 3, H, W]`` tiles or frames to ``[n, gh*gw, C]`` patch features."""
        ...

    def forward_video(self, frames: torch.Tensor, temporal_patch_size: int) -> torch.Tensor:
        """``[v, 3, H, W]`` frames of one video to ``[ceil(v/T), gh*gw, C]`` tubelet features."""
        ...

    def forward_dynamic(self, images: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Images ``[3, H_i, W_i]`` at their own sizes to ``[gh_i*gw_i, C]`` features each."""
        ...


class SoundEncoder(Protocol):
    """What the wrapper needs of an audio tower (Parakeet + projection, or a test double)."""

    def __call__(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``[c, l, m]`` features and ``[c, l]`` mask to ``[c, l', h]`` embeddings."""
        ...

    def output_lengths(self, input_lengths: torch.Tensor) -> torch.Tensor:
        """Valid output frames per clip for ``input_lengths`` valid input frames."""
        ...


class NanoNemotronVLModel(nn.Module):
    """The multimodal half of Nano-Nemotron VL around a language model's embedding table."""

    def __init__(
        self,
        config: VLConfig,
        *,
        vision_model: VisionTower,
        embed_tokens: nn.Embedding,
        tokenizer: PreTrainedTokenizerBase,
        sound_encoder: SoundEncoder | None = None,
    ) -> None:
        super().__init__()
        if embed_tokens.embedding_dim != config.hidden_size:
            raise InputValidationError(
                "embed_tokens.embedding_dim",
                f"hidden_size={config.hidden_size}",
                embed_tokens.embedding_dim,
            )
        if config.has_audio and sound_encoder is None:
            raise InputValidationError(
                "sound_encoder", "an audio tower (config.has_audio is True)", None
            )
        self.config = config
        self.vision_model = vision_model
        self.connector = Connector(config)
        self.embed_tokens: nn.Module = embed_tokens  # a LoRA wrapper may replace it
        self.tokenizer = tokenizer
        self.sound_encoder = sound_encoder
        self.img_context_ids = tokenizer.encode(IMG_CONTEXT, add_special_tokens=False)

    # -----------------------------------------------------------------------------------------
    # Parse and route

    def parse_multimodal_inputs(self, **kwargs: object) -> MultiModalInputs:
        """Route each keyword to its modality and build validated inputs.

        Keys with a ``None`` value are ignored, as are keys that name no multimodal input. The
        result's key order is the order in which each modality's first routing key appears.
        """
        present = {key: value for key, value in kwargs.items() if value is not None}
        for key, owner in COMPANION_KEYS.items():
            if key in present and owner not in present:
                raise InputValidationError(key, f"to accompany {owner!r}", f"no {owner!r}")
        parsed: MultiModalInputs = {}
        for key in present:
            modality = ROUTING_KEYS.get(key)
            if modality == "images" and "images" not in parsed:
                parsed["images"] = self._parse_images(present)
            elif modality == "videos" and "videos" not in parsed:
                parsed["videos"] = self._parse_videos(present)
            elif modality == "audios" and "audios" not in parsed:
                parsed["audios"] = self._parse_audios(present)
        return parsed

    def _parse_embeddings(
        self, kw: Mapping[str, object], cls: type[EmbeddingT], pixels_key: str
    ) -> EmbeddingT | None:
        """The modality's precomputed embeddings, or None when it came as pixels. Both forms in
        one call are an error: upstream silently drops the pixels."""
        key = cls.kind
        embeds = kw.get(key)
        if embeds is None:
            return None
        if kw.get(pixels_key) is not None:
            raise InputValidationError(key, f"either {key} or {pixels_key}, not both", "both")
        inputs = cls(data=_embedding_data(key, embeds))
        inputs.validate(self.config.hidden_size)
        return inputs

    def _parse_images(self, kw: Mapping[str, object]) -> ImageInputs:
        embeds = self._parse_embeddings(kw, ImageEmbeddingInputs, "pixel_values_flat")
        if embeds is not None:
            return embeds
        pixels = kw.get("pixel_values_flat")
        if self.config.dynamic_resolution:
            images = _image_list("pixel_values_flat", pixels)
            sizes = _sizes_list("imgs_sizes", _required(kw, "imgs_sizes", "pixel_values_flat"))
            tokens = int_list(
                "num_tokens_per_image",
                _required(kw, "num_tokens_per_image", "pixel_values_flat"),
            )
            dyn = ImagePixelDynamicInputs(
                pixel_values=images, imgs_sizes=sizes, num_tokens_per_image=tokens
            )
            dyn.validate(self.config.patch_size, self.config.shuffle_factor)
            return dyn
        static = ImagePixelInputs(
            pixel_values_flat=pixels,  # type: ignore[arg-type]  # validated just below
            num_patches=int_list(
                "image_num_patches", _required(kw, "image_num_patches", "pixel_values_flat")
            ),
        )
        static.validate(self.config.force_image_size)
        return static

    def _parse_videos(self, kw: Mapping[str, object]) -> VideoInputs:
        embeds = self._parse_embeddings(kw, VideoEmbeddingInputs, "pixel_values_flat_video")
        if embeds is not None:
            return embeds
        pixels = kw.get("pixel_values_flat_video")
        if isinstance(pixels, (list, tuple)):
            # One [f_i, 3, H_i, W_i] tensor per video: the frames concatenated when they share
            # a size, kept per video when not (each video resized keeping its aspect ratio).
            frames = _image_list("pixel_values_flat_video", pixels)
            if all(f.ndim == 4 for f in frames):
                one_size = len({tuple(f.shape[1:]) for f in frames}) == 1
                pixels = torch.cat(frames) if one_size else frames
        elif isinstance(pixels, torch.Tensor) and pixels.ndim == 5:
            pixels = pixels.flatten(0, 1)  # [n, f, 3, H, W] -> [n*f, 3, H, W]
        video = VideoPixelInputs(
            pixel_values_flat=pixels,  # type: ignore[arg-type]  # validated just below
            num_frames=int_list(
                "video_num_patches", _required(kw, "video_num_patches", "pixel_values_flat_video")
            ),
            frames_indices=_flat_int_list(
                "frames_indices", _required(kw, "frames_indices", "pixel_values_flat_video")
            ),
            frame_duration_ms=_flat_int_list(
                "frame_duration_ms", _required(kw, "frame_duration_ms", "pixel_values_flat_video")
            ),
        )
        video.validate(self.config.patch_size, self.config.shuffle_factor)
        return video

    def _parse_audios(self, kw: Mapping[str, object]) -> AudioFeatureInputs:
        if self.sound_encoder is None:
            raise InputValidationError(
                "input_audio_features", "no audio input (this model has no sound_config)", "audio"
            )
        features = _required(kw, "input_audio_features", "audio inputs")
        mask = _required(kw, "feature_attention_mask", "audio inputs")
        audio = AudioFeatureInputs(
            input_audio_features=features,  # type: ignore[arg-type]  # validated just below
            feature_attention_mask=mask,  # type: ignore[arg-type]
            audio_num_clips=int_list(
                "audio_num_clips", _required(kw, "audio_num_clips", "audio inputs")
            ),
        )
        audio.validate()
        return audio

    # -----------------------------------------------------------------------------------------
    # Embed

    def embed_multimodal(
        self, *, placeholder_counts: Sequence[int] | None = None, **kwargs: object
    ) -> MultiModalEmbeddings:
        """One ``[f_i, h]`` tensor per item, modalities in first-key order.

        Precomputed embeddings are returned verbatim (the rows of a stacked ``[n, f, h]`` tensor,
        or the list's tensors); pixels and audio features go through the towers held here.

        Args:
            placeholder_counts: when the prompt's placeholder count of each item is known (one
                int per output, in output order), mismatching row counts raise here instead of
                in the merge.
        """
        outputs: list[torch.Tensor] = []
        sources: list[str] = []
        for key, items in self.embed_by_modality(**kwargs).values():
            outputs += items
            sources += [f"{key}[{i}]" for i in range(len(items))]
        if placeholder_counts is not None:
            check_placeholder_counts(outputs, sources, placeholder_counts)
        return tuple(outputs)

    def embed_by_modality(self, **kwargs: object) -> dict[str, tuple[str, list[torch.Tensor]]]:
        """``{modality: (name for errors, one [f_i, h] tensor per item)}`` in first-key order;
        the name is the embedding key for precomputed embeddings, else the modality."""
        out: dict[str, tuple[str, list[torch.Tensor]]] = {}
        for modality, inputs in self.parse_multimodal_inputs(**kwargs).items():
            if isinstance(inputs, (ImageEmbeddingInputs, VideoEmbeddingInputs)):
                out[modality] = (inputs.kind, list(inputs.data))  # verbatim: no encoder
            elif isinstance(inputs, ImagePixelInputs):
                out[modality] = (modality, self._embed_image_tiles(inputs))
            elif isinstance(inputs, ImagePixelDynamicInputs):
                out[modality] = (modality, self._embed_images_dynamic(inputs))
            elif isinstance(inputs, VideoPixelInputs):
                out[modality] = (modality, self._embed_videos(inputs))
            elif isinstance(inputs, AudioFeatureInputs):
                out[modality] = (modality, self._embed_audios(inputs))
            else:  # pragma: no cover - the parse result is exhaustive
                raise TypeError(f"unknown {modality} inputs {type(inputs).__name__}")
        return out

    def _embed_frames(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``[n, 3, H, W]`` tiles or frames to ``[n, k, h]``."""
        p = self.config.patch_size
        grid = (pixel_values.shape[-2] // p, pixel_values.shape[-1] // p)
        features = self.vision_model.forward_tiles(pixel_values)
        out: torch.Tensor = self.connector(features, grid)
        return out

    def _embed_image_tiles(self, inputs: ImagePixelInputs) -> list[torch.Tensor]:
        per_tile = self._embed_frames(inputs.pixel_values_flat)  # [t, k, h]
        return [
            tiles.reshape(-1, self.config.hidden_size)
            for tiles in torch.split(per_tile, inputs.num_patches)
        ]

    def _embed_images_dynamic(self, inputs: ImagePixelDynamicInputs) -> list[torch.Tensor]:
        p = self.config.patch_size
        features = self.vision_model.forward_dynamic(inputs.pixel_values)
        return [
            self.connector(f.unsqueeze(0), (h // p, w // p)).reshape(-1, self.config.hidden_size)
            for f, (h, w) in zip(features, inputs.imgs_sizes, strict=True)
        ]

    def _embed_videos(self, inputs: VideoPixelInputs) -> list[torch.Tensor]:
        t = self.config.video_temporal_patch_size
        frames_per_video = inputs.per_video()
        indices_per_video = _split_list(inputs.frames_indices, inputs.num_frames)
        p = self.config.patch_size
        out = []
        for i, frames in enumerate(frames_per_video):
            if t > 1:
                grid = (frames.shape[-2] // p, frames.shape[-1] // p)
                groups = self.connector(self.vision_model.forward_video(frames, t), grid)
            else:
                groups = self._embed_frames(frames)  # [g, k, h], one group per frame
            expected_groups = math.ceil(len(frames) / t)
            if groups.shape[0] != expected_groups:
                raise InputValidationError(
                    "vision_model.forward_video", f"{expected_groups} tubelets", groups.shape[0]
                )
            # EVS: the kept rows and each group's count (every row at rate 0).
            rows, per_group = prune(groups, self.config.video_pruning_rate)
            out.append(
                self._video_embeddings_with_text(
                    rows, per_group, indices_per_video[i], inputs.frame_duration_ms[i]
                )
            )
        return out

    def _video_embeddings_with_text(
        self,
        rows: torch.Tensor,
        per_group: Sequence[int],
        frames_indices: Sequence[int],
        frame_duration_ms: int,
    ) -> torch.Tensor:
        """Fill one video's whole replacement: text embeddings at separator and tag positions,
        the ``[n, h]`` vision rows at the ``<image>`` positions, ``per_group[t]`` after group
        ``t``'s separator.

        These tokens are made here, not by the scheduler, so they are embedded with the base
        embedding table (no LoRA index-mapping entry exists for them).
        """
        ids = video_replacement_ids(
            self.tokenizer,
            per_group,
            frames_indices,
            frame_duration_ms,
            self.config.video_temporal_patch_size,
        )
        device = rows.device
        ids_t = torch.tensor(ids, device=device)
        is_context = torch.isin(ids_t, torch.tensor(self.img_context_ids, device=device))
        text = base_embedding(self.embed_tokens)(ids_t).to(rows.dtype)
        return merge_multimodal_embeddings(text, (rows,), is_context)

    def _embed_audios(self, inputs: AudioFeatureInputs) -> list[torch.Tensor]:
        assert self.sound_encoder is not None  # _parse_audios checked it
        embeds = self.sound_encoder(inputs.input_audio_features, inputs.feature_attention_mask)
        lengths = self.sound_encoder.output_lengths(inputs.feature_attention_mask.sum(1))
        out, clip = [], 0
        for num_clips in inputs.audio_num_clips:
            valid = [embeds[c, : int(lengths[c])] for c in range(clip, clip + num_clips)]
            out.append(torch.cat(valid))
            clip += num_clips
        return out


# ---------------------------------------------------------------------------------------------
# Merge


def merge_multimodal_embeddings(
    inputs_embeds: torch.Tensor,
    multimodal_embeddings: Sequence[torch.Tensor],
    is_multimodal: torch.Tensor,
) -> torch.Tensor:
    """Overwrite the placeholder rows of ``inputs_embeds [L, h]`` with the items' rows, in order.

    Raises :class:`InputValidationError` when the rows do not match the placeholders in number.
    """
    if len(multimodal_embeddings) == 0:
        return inputs_embeds
    rows = torch.cat([e.reshape(-1, e.shape[-1]) for e in multimodal_embeddings])
    slots = int(is_multimodal.sum())
    if rows.shape[0] != slots:
        counts = " + ".join(str(e.shape[0]) for e in multimodal_embeddings)
        raise InputValidationError(
            "multimodal_embeddings",
            f"{slots} rows (the placeholder count)",
            f"{counts} = {rows.shape[0]} rows",
        )
    out = inputs_embeds.clone()
    out[is_multimodal] = rows.to(out.dtype)
    return out


def check_placeholder_counts(
    outputs: Sequence[torch.Tensor], sources: Sequence[str], placeholder_counts: Sequence[int]
) -> None:
    """Each output's row count must equal its item's placeholder count."""
    if len(placeholder_counts) != len(outputs):
        raise InputValidationError(
            "placeholder_counts", f"{len(outputs)} counts (one per item)", len(placeholder_counts)
        )
    for out, source, count in zip(outputs, sources, placeholder_counts, strict=True):
        if out.shape[0] != count:
            raise InputValidationError(
                source, f"{count} rows (its placeholder count)", f"{out.shape[0]} rows"
            )


# ---------------------------------------------------------------------------------------------
# Coercion helpers: accept the forms vLLM's batching produces, reject everything else clearly.


def _required(kw: Mapping[str, object], key: str, owner: str) -> object:
    value = kw.get(key)
    if value is None:
        raise InputValidationError(key, f"present with {owner}", "missing")
    return value


def _embedding_data(field: str, value: object) -> torch.Tensor | list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)):
        return list(value)
    raise InputValidationError(
        field, "a [n, f, h] tensor or a list of [f_i, h] tensors", describe(value)
    )


def _image_list(field: str, value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor) and value.ndim == 4:
        return list(value.unbind(0))
    if isinstance(value, (list, tuple)) and all(isinstance(v, torch.Tensor) for v in value):
        return list(value)
    raise InputValidationError(
        field, "a list of [3, H, W] tensors or a [n, 3, H, W] tensor", describe(value)
    )


def _sizes_list(field: str, value: object) -> list[tuple[int, int]]:
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, (list, tuple)) and all(
        isinstance(s, (list, tuple)) and len(s) == 2 and all(isinstance(x, int) for x in s)
        for s in value
    ):
        return [(int(s[0]), int(s[1])) for s in value]
    raise InputValidationError(field, "a list of (height, width) int pairs", describe(value))


def _flat_int_list(field: str, value: object) -> list[int]:
    """An int tensor of any rank, or a list of int tensors / ints, flattened."""
    if isinstance(value, torch.Tensor):
        return int_list(field, value.flatten())
    if isinstance(value, (list, tuple)):
        out: list[int] = []
        for i, v in enumerate(value):
            if isinstance(v, torch.Tensor):
                out += int_list(f"{field}[{i}]", v.flatten())
            elif isinstance(v, int) and not isinstance(v, bool):
                out.append(v)
            else:
                raise InputValidationError(f"{field}[{i}]", "an int or int tensor", describe(v))
        return out
    raise InputValidationError(field, "an int tensor or a list of them", describe(value))


def _split_list(values: Sequence[int], sizes: Sequence[int]) -> list[list[int]]:
    out, start = [], 0
    for size in sizes:
        out.append(list(values[start : start + size]))
        start += size
    return out


# ---------------------------------------------------------------------------------------------
# The whole model


class NanoNemotronVLForConditionalGeneration(nn.Module):
    """Language model, RADIO, connector and (Omni) Parakeet: a processed prompt in, logits and
    greedy tokens out. LoRA covers the language model only: its metadata is the LM's."""

    packed_modules_mapping = NemotronHForCausalLM.packed_modules_mapping
    embedding_modules = NemotronHForCausalLM.embedding_modules
    lora_skip_prefixes = NemotronHForCausalLM.lora_skip_prefixes
    is_non_gated_moe = NemotronHForCausalLM.is_non_gated_moe

    def __init__(self, config: VLConfig, tokenizer: PreTrainedTokenizerBase) -> None:
        super().__init__()
        if config.text_config is None or config.vision_config is None:
            raise InputValidationError("config", "text_config and vision_config", "missing")
        self.config = config
        self.language_model = NemotronHForCausalLM(config.text_config)
        self.multimodal = NanoNemotronVLModel(
            config,
            vision_model=RadioVisionModel(config.vision_config),
            embed_tokens=self.language_model.model.embed_tokens,
            tokenizer=tokenizer,
            sound_encoder=(
                ParakeetAudioTower(config.sound_config) if config.sound_config is not None else None
            ),
        )

    def embed(
        self,
        input_ids: torch.Tensor,
        is_multimodal: torch.Tensor,
        placeholders: Sequence[Placeholder],
        **mm_kwargs: Any,
    ) -> torch.Tensor:
        """``[l]`` prompt ids to ``[l, h]`` embeddings, multimodal positions filled in prompt
        order."""
        embeds = self.language_model.embed_input_ids(input_ids)
        if not placeholders:
            return embeds
        by_modality = self.multimodal.embed_by_modality(**mm_kwargs)
        ordered = []
        for span in sorted(placeholders, key=lambda p: p.start):
            item = by_modality[span.modality][1][span.index]
            if item.shape[0] != span.length:
                raise InputValidationError(
                    f"{span.modality}[{span.index}]",
                    f"{span.length} rows (its placeholder count)",
                    f"{item.shape[0]} rows",
                )
            ordered.append(item)
        return merge_multimodal_embeddings(embeds, ordered, is_multimodal)

    def forward(
        self,
        input_ids: torch.Tensor,
        is_multimodal: torch.Tensor,
        placeholders: Sequence[Placeholder],
        **mm_kwargs: Any,
    ) -> torch.Tensor:
        """Logits ``[l, V]`` for one processed prompt."""
        embeds = self.embed(input_ids, is_multimodal, placeholders, **mm_kwargs)
        logits: torch.Tensor = self.language_model(inputs_embeds=embeds[None])[0]
        return logits

    @torch.no_grad()
    def generate(self, prompt: ProcessorOutput, max_new_tokens: int) -> list[int]:
        """Greedy decoding of ``max_new_tokens`` after a processed prompt."""
        device = self.language_model.lm_head.weight.device
        ids = torch.tensor(prompt.input_ids, device=device)
        mask = torch.tensor(prompt.is_multimodal, device=device)
        embeds = self.embed(ids, mask, prompt.placeholders, **prompt.mm_kwargs)
        lm = self.language_model
        cache = lm.new_cache(1, len(ids) + max_new_tokens)
        token = lm(inputs_embeds=embeds[None], cache=cache)[0, -1].argmax()
        out = [int(token)]
        for _ in range(max_new_tokens - 1):
            token = lm(token.reshape(1, 1), cache=cache)[0, -1].argmax()
            out.append(int(token))
        return out
