"""The processor: a prompt's ``<image>`` / ``<video>`` / ``<so_embedding>`` placeholders
expanded into token ids, and the model's keyword inputs built from the request's items.

Glossary: ``t`` tiles of an image, ``S`` tile side, ``P`` patch side, ``r`` shuffle factor (2),
``F`` frames of a video, ``H, W`` an image's or a frame's height and width, ``f`` rows of a
precomputed embedding, ``h`` the language model's hidden size, ``k`` placeholder tokens of one
item, ``n`` tokens of the expanded prompt.

One call (:meth:`NanoNemotronVLProcessor.__call__`) runs in stages:

1. with ``audio_in_video``, each video's audio track joins the audio items;
2. checks: embeddings, the tile limit, one item per placeholder;
3. per modality, the model's inputs and each item's placeholder tokens (tiles, patch grids and
   frame sizes from :mod:`reference_impl.tiling`, a video's replacement from
   :mod:`reference_impl.video_replacement`, audio features from :mod:`reference_impl.audio`);
4. the prompt expanded piece by piece.

What an engine asks before any request, answered from the config alone, is in
:mod:`reference_impl.metadata`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

import torch
from transformers import PreTrainedTokenizerBase

from reference_impl.audio import audio_token_count, extract_features, to_mono
from reference_impl.config import VLConfig
from reference_impl.errors import ConfigError
from reference_impl.evs import placeholder_tokens_per_group
from reference_impl.media import audio_track
from reference_impl.tiling import dynamic_grids, resize_normalize, tile_image, video_frame_size
from reference_impl.tokenizer import (
    AUDIO_CONTEXT,
    AUDIO_END,
    AUDIO_START,
    IMG_CONTEXT,
    IMG_END,
    IMG_START,
    VIDEO_PLACEHOLDER,
)
from reference_impl.video_replacement import video_replacement_ids


@dataclass(frozen=True)
class Video:
    """Decoded frames ``[F, H, W, 3]`` (uint8) with the metadata the separators need, and the
    file's bytes where the request has them (``audio_in_video`` decodes its audio track)."""

    frames: torch.Tensor
    fps: float = 2.0
    frames_indices: Sequence[int] | None = None
    data: bytes | None = None


@dataclass(frozen=True)
class Placeholder:
    """One item's span of placeholder positions in the expanded prompt."""

    modality: str  # "images" | "videos" | "audios"
    index: int  # the item's index within its modality
    start: int
    length: int


@dataclass
class ProcessorOutput:
    input_ids: list[int]
    is_multimodal: list[bool]  # positions the model fills with multimodal embeddings
    placeholders: list[Placeholder]
    mm_kwargs: dict[str, object] = field(default_factory=dict)
    num_tokens_per_image: list[int] = field(default_factory=list)


#: The model's inputs of one modality and each item's ``k`` (images, audio).
ModalityInputs: TypeAlias = tuple[dict[str, object], list[int]]

_PLACEHOLDER = re.compile(
    f"({re.escape(IMG_CONTEXT)}|{re.escape(VIDEO_PLACEHOLDER)}|{re.escape(AUDIO_CONTEXT)})"
)


def _image_tensor(image: object, index: int) -> torch.Tensor:
    """An ``[H, W, 3]`` RGB image (uint8 or 0..255 floats) as float ``[3, H, W]``."""
    x = torch.as_tensor(image)
    if x.ndim != 3 or x.shape[-1] != 3:
        raise ConfigError(f"images[{index}]", "an RGB image [H, W, 3]", tuple(x.shape))
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ConfigError(f"images[{index}]", "a non-empty image", tuple(x.shape))
    return x.permute(2, 0, 1).float()


def _video_frames(video: Video, index: int) -> tuple[torch.Tensor, list[int]]:
    """A video's ``[F, H, W, 3]`` frames, checked, and the ``F`` indices they were sampled at
    (``0..F-1`` when the video does not say)."""
    frames = torch.as_tensor(video.frames)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ConfigError(f"videos[{index}].frames", "RGB frames [F, H, W, 3]", tuple(frames.shape))
    if frames.shape[0] == 0:
        raise ConfigError(f"videos[{index}].frames", "at least one frame", "0 frames")
    if video.fps <= 0:
        raise ConfigError(f"videos[{index}].fps", "a positive frame rate", video.fps)
    indices = (
        list(video.frames_indices)
        if video.frames_indices is not None
        else list(range(frames.shape[0]))
    )
    if len(indices) != frames.shape[0]:
        raise ConfigError(
            f"videos[{index}].frames_indices",
            f"one index per frame ({frames.shape[0]})",
            len(indices),
        )
    return frames, indices


class NanoNemotronVLProcessor:
    """Expands a prompt's ``<image>`` / ``<video>`` / ``<so_embedding>`` placeholders and builds
    the model's inputs. Holds no per-object state beyond the config and the tokenizer."""

    def __init__(self, config: VLConfig, tokenizer: PreTrainedTokenizerBase) -> None:
        self.config = config
        self.tokenizer = tokenizer

        def encode(text: str) -> list[int]:
            ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
            return ids

        self.img_start, self.img_end = encode(IMG_START), encode(IMG_END)
        self.img_context = encode(IMG_CONTEXT)
        self.audio_start, self.audio_end = encode(AUDIO_START), encode(AUDIO_END)
        self.audio_context = encode(AUDIO_CONTEXT)

    # -- the prompt ---------------------------------------------------------------------

    def __call__(
        self,
        text: str,
        images: Sequence[object] = (),
        videos: Sequence[Video] = (),
        audios: Sequence[torch.Tensor | Sequence[float]] = (),
        max_num_tiles: int | None = None,
        image_embeds: Sequence[torch.Tensor] = (),
        video_embeds: Sequence[torch.Tensor] = (),
        audio_in_video: bool = False,
    ) -> ProcessorOutput:
        """Expand ``text``'s placeholders for the items given.

        ``images``: ``[H, W, 3]`` RGB images; ``videos``: :class:`Video` items; ``audios``:
        ``[samples]`` or ``[samples, channels]`` waveforms at the sound config's rate.

        ``image_embeds`` / ``video_embeds``: precomputed ``[f, h]`` embeddings in place of images
        or videos (not both forms of one modality in one request); an image's ``f`` rows fill
        ``<img>`` + ``f`` context tokens + ``</img>``, a video's fill ``f`` context tokens.

        ``audio_in_video``: each video's audio track is an audio item too, its placeholder right
        after the video's (:meth:`_audio_from_videos`).
        """
        if audio_in_video:
            text, audios = self._audio_from_videos(text, videos, video_embeds, audios)
        self._check_embeddings(images, videos, image_embeds, video_embeds)
        max_tiles = self._tile_limit(max_num_tiles)
        pieces = self._split_prompt(text, images or image_embeds, videos or video_embeds, audios)
        image_kwargs, image_counts = self._image_inputs(images, image_embeds, text, max_tiles)
        video_kwargs, video_ids = self._video_inputs(videos, video_embeds)
        audio_kwargs, audio_counts = self._audio_inputs(audios)
        ids, is_multimodal, spans = self._expand(pieces, image_counts, video_ids, audio_counts)
        kwargs = image_kwargs | video_kwargs | audio_kwargs
        return ProcessorOutput(ids, is_multimodal, spans, kwargs, image_counts)

    # -- checks -------------------------------------------------------------------------

    def _check_embeddings(
        self,
        images: Sequence[object],
        videos: Sequence[Video],
        image_embeds: Sequence[torch.Tensor],
        video_embeds: Sequence[torch.Tensor],
    ) -> None:
        """Images or ``image_embeds``, videos or ``video_embeds``, never both forms of one
        modality; every embedding a ``[f, h]`` tensor."""
        hidden = self.config.hidden_size
        for media, embeds, name in (
            (images, image_embeds, "image"),
            (videos, video_embeds, "video"),
        ):
            if media and embeds:
                raise ConfigError(
                    f"{name}_embeds",
                    f"{name}s or {name}_embeds in one request, not both",
                    f"{len(media)} {name}s and {len(embeds)} embeddings",
                )
        for name, given in (("image_embeds", image_embeds), ("video_embeds", video_embeds)):
            for i, e in enumerate(given):
                if not isinstance(e, torch.Tensor) or e.ndim != 2 or e.shape[1] != hidden:
                    got = tuple(e.shape) if isinstance(e, torch.Tensor) else type(e).__name__
                    raise ConfigError(f"{name}[{i}]", f"a [f, {hidden}] tensor", got)

    def _tile_limit(self, max_num_tiles: int | None) -> int:
        """The request's limit of static tiles per image: the config's ``max_num_tiles``, or a
        lower one the request asks for (``1..max_num_tiles``)."""
        limit = self.config.max_num_tiles
        max_tiles = limit if max_num_tiles is None else max_num_tiles
        if not 1 <= max_tiles <= limit:
            raise ConfigError("max_num_tiles", f"1..{limit} (the config's limit)", max_tiles)
        return max_tiles

    def _split_prompt(
        self,
        text: str,
        images: Sequence[object],
        videos: Sequence[object],
        audios: Sequence[torch.Tensor | Sequence[float]],
    ) -> list[str]:
        """``text`` split at its placeholders, each ``<image>`` / ``<video>`` /
        ``<so_embedding>`` a piece of its own, once every modality has one item per placeholder
        (``images`` and ``videos``: the items in either form) and audio only where the model
        has a sound encoder."""
        pieces = _PLACEHOLDER.split(text)
        for token, items, name in (
            (IMG_CONTEXT, images, "images"),
            (VIDEO_PLACEHOLDER, videos, "videos"),
            (AUDIO_CONTEXT, audios, "audios"),
        ):
            found = pieces.count(token)
            if found != len(items):
                raise ConfigError(
                    name, f"one item per {token} in the prompt ({found})", f"{len(items)} items"
                )
        if audios and not self.config.has_audio:
            raise ConfigError("audios", "none (this model has no sound_config)", len(audios))
        return pieces

    # -- per modality -------------------------------------------------------------------

    def _image_inputs(
        self,
        images: Sequence[object],
        image_embeds: Sequence[torch.Tensor],
        text: str,
        max_tiles: int,
    ) -> ModalityInputs:
        """The model's image inputs and each image's ``k``: pixels cut into static tiles
        (:meth:`_static_tiles`) or resized to a patch grid (:meth:`_dynamic_patches`), or
        ``[f, h]`` embeddings passed on as ``image_embeds`` (``k = f``)."""
        if images:
            pixels = [_image_tensor(image, i) for i, image in enumerate(images)]
            if self.config.dynamic_resolution:
                return self._dynamic_patches(pixels, text)
            return self._static_tiles(pixels, max_tiles)
        if image_embeds:
            return {"image_embeds": list(image_embeds)}, [int(e.shape[0]) for e in image_embeds]
        return {}, []

    def _static_tiles(self, pixels: list[torch.Tensor], max_tiles: int) -> ModalityInputs:
        """Each ``[3, H, W]`` image as ``[t, 3, S, S]`` tiles (at most ``max_tiles``, the
        thumbnail besides), ``k = t * num_image_token``.

        Returns ``pixel_values_flat`` ``[sum t, 3, S, S]`` and ``image_num_patches`` (each
        image's ``t``)."""
        c = self.config
        tiles = [
            tile_image(p, c.force_image_size, max_tiles, c.use_thumbnail, c.norm_mean, c.norm_std)
            for p in pixels
        ]
        counts = [len(t) * c.num_image_token for t in tiles]
        return {
            "pixel_values_flat": torch.cat(tiles),
            "image_num_patches": torch.tensor([len(t) for t in tiles]),
        }, counts

    def _dynamic_patches(self, pixels: list[torch.Tensor], text: str) -> ModalityInputs:
        """Each ``[3, H, W]`` image resized to a ``(cols, rows)`` patch grid, the images sharing
        the context the text leaves (less 4 tokens); ``k = cols * rows / r^2``.

        Returns ``pixel_values_flat`` (a list of ``[3, rows*P, cols*P]``), ``imgs_sizes`` (their
        ``(height, width)``) and ``num_tokens_per_image`` (each image's ``k``)."""
        c = self.config
        text_len = len(
            self.tokenizer.encode(text.replace(IMG_CONTEXT, ""), add_special_tokens=False)
        )
        grids = dynamic_grids(
            [(p.shape[2], p.shape[1]) for p in pixels],
            c.max_model_len - text_len - 4,
            c.patch_size,
            c.min_num_patches,
            c.max_num_patches,
        )
        resized = [
            resize_normalize(
                p[None], rows * c.patch_size, cols * c.patch_size, c.norm_mean, c.norm_std
            )[0]
            for p, (cols, rows) in zip(pixels, grids, strict=True)
        ]
        counts = [cols * rows // c.shuffle_factor**2 for cols, rows in grids]
        return {
            "pixel_values_flat": resized,
            "imgs_sizes": [(int(r.shape[1]), int(r.shape[2])) for r in resized],
            "num_tokens_per_image": counts,
        }, counts

    def _video_inputs(
        self, videos: Sequence[Video], video_embeds: Sequence[torch.Tensor]
    ) -> tuple[dict[str, object], list[list[int]]]:
        """The model's video inputs and each video's replacement ids: frames
        (:meth:`_video_pixels`), or ``[f, h]`` embeddings passed on as ``video_embeds`` (their
        replacement ``f`` context tokens)."""
        if videos:
            return self._video_pixels(videos)
        if video_embeds:
            ids = [self.img_context * int(e.shape[0]) for e in video_embeds]
            return {"video_embeds": list(video_embeds)}, ids
        return {}, []

    def _video_pixels(self, videos: Sequence[Video]) -> tuple[dict[str, object], list[list[int]]]:
        """Every video's ``[F, H, W, 3]`` frames resized to one ``(h, w)``
        (:func:`~reference_impl.tiling.video_frame_size`) and normalised, and its replacement
        ids: per frame or tubelet a separator and its tokens, EVS-pruned when the config
        prunes (:func:`~reference_impl.video_replacement.video_replacement_ids`).

        Returns ``pixel_values_flat_video`` ``[sum F, 3, h, w]``, ``video_num_patches`` (each
        video's ``F``), ``frames_indices`` ``[sum F]`` and ``frame_duration_ms`` (one per video).
        """
        c = self.config
        pixels, counts, indices, durations, replacements = [], [], [], [], []
        for i, video in enumerate(videos):
            frames, index = _video_frames(video, i)
            w, h, per_frame = video_frame_size(
                frames.shape[2],
                frames.shape[1],
                c.force_image_size,
                c.patch_size,
                c.downsample_ratio,
                c.video_target_num_patches,
                c.video_maintain_aspect_ratio,
            )
            pixels.append(
                resize_normalize(frames.permute(0, 3, 1, 2), h, w, c.norm_mean, c.norm_std)
            )
            duration = int(1000 / video.fps)
            groups = math.ceil(frames.shape[0] / c.video_temporal_patch_size)
            replacements.append(
                video_replacement_ids(
                    self.tokenizer,
                    placeholder_tokens_per_group(per_frame, groups, c.video_pruning_rate),
                    index,
                    duration,
                    c.video_temporal_patch_size,
                )
            )
            counts.append(frames.shape[0])
            indices.append(torch.tensor(index))
            durations.append(duration)
        # Videos resized keeping their aspect ratios differ in frame size: one tensor each.
        one_size = len({tuple(p.shape[-2:]) for p in pixels}) == 1
        return {
            "pixel_values_flat_video": torch.cat(pixels) if one_size else pixels,
            "video_num_patches": torch.tensor(counts),
            "frames_indices": torch.cat(indices),
            "frame_duration_ms": torch.tensor(durations),
        }, replacements

    def _audio_inputs(self, audios: Sequence[torch.Tensor | Sequence[float]]) -> ModalityInputs:
        """Every waveform's log-mel features in clips and its ``k``
        (:func:`~reference_impl.audio.audio_token_count` of its samples).

        Returns ``input_audio_features`` ``[c, l, m]`` (``c`` clips of ``l`` frames of ``m``
        mel bins), ``feature_attention_mask`` ``[c, l]`` and ``audio_num_clips`` (each item's
        clips)."""
        if not audios:
            return {}, []
        sound = self.config.sound_config
        assert sound is not None, "has_audio without a sound_config"
        features, mask, clips = extract_features(audios, sound)
        counts = [audio_token_count(len(to_mono(a, i)), sound) for i, a in enumerate(audios)]
        return {
            "input_audio_features": features,
            "feature_attention_mask": mask,
            "audio_num_clips": clips,
        }, counts

    def _audio_from_videos(
        self,
        text: str,
        videos: Sequence[Video],
        video_embeds: Sequence[torch.Tensor],
        audios: Sequence[torch.Tensor | Sequence[float]],
    ) -> tuple[str, list[torch.Tensor | Sequence[float]]]:
        """The prompt and audio items of an ``audio_in_video`` request.

        Each video's track comes from its file's bytes (:func:`reference_impl.media.audio_track`,
        bounded by ``max_audio_duration_s``), or, where the request already carries one audio
        item per video, is that item. A ``<so_embedding>`` follows the ``<video>`` of every
        video with a track; a video without one stays alone.
        """
        c = self.config
        if c.sound_config is None:
            raise ConfigError("audio_in_video", "a model with a sound_config", "none")
        if video_embeds:
            raise ConfigError(
                "audio_in_video",
                "video files (their tracks are read from the bytes)",
                f"{len(video_embeds)} video embeddings",
            )
        found = text.count(VIDEO_PLACEHOLDER)
        if found != len(videos):
            raise ConfigError(
                "videos",
                f"one item per {VIDEO_PLACEHOLDER} in the prompt ({found})",
                f"{len(videos)} items",
            )
        tracks: list[torch.Tensor | Sequence[float] | None]
        if audios:
            if len(audios) != len(videos):
                raise ConfigError(
                    "audios",
                    f"one track per video with audio_in_video ({len(videos)})",
                    f"{len(audios)} items",
                )
            tracks = list(audios)
        else:
            tracks = []
            for i, video in enumerate(videos):
                if not video.data:
                    raise ConfigError(
                        f"videos[{i}].data",
                        "the video file's bytes (audio_in_video decodes its audio track)",
                        "none" if video.data is None else "0 bytes",
                    )
                tracks.append(
                    audio_track(
                        video.data,
                        c.sound_config.sampling_rate,
                        c.max_audio_duration_s,
                        f"videos[{i}].data",
                    )
                )
        head, *rest = text.split(VIDEO_PLACEHOLDER)
        pieces = [head]
        for track, after in zip(tracks, rest, strict=True):
            pieces.append(VIDEO_PLACEHOLDER + (AUDIO_CONTEXT if track is not None else "") + after)
        return "".join(pieces), [t for t in tracks if t is not None]

    # -- expansion ----------------------------------------------------------------------

    def _expand(
        self,
        pieces: Sequence[str],
        image_counts: Sequence[int],
        video_ids: Sequence[list[int]],
        audio_counts: Sequence[int],
    ) -> tuple[list[int], list[bool], list[Placeholder]]:
        """The prompt's pieces (:meth:`_split_prompt`) as ``n`` token ids, ``n`` flags (True
        where the model puts multimodal embeddings) and every item's span.

        An image becomes ``<img>`` + ``k`` context tokens + ``</img>``, an audio item
        ``<so_start>`` + ``k`` context tokens + ``<so_end>`` (the context tokens flagged and
        spanned); a video its replacement ids, every position flagged and spanned (separators
        and tags too); text is tokenised piece by piece."""
        ids: list[int] = []
        mm: list[bool] = []
        spans: list[Placeholder] = []
        seen = {"images": 0, "videos": 0, "audios": 0}

        def add(tokens: list[int], flags: list[bool]) -> None:
            ids.extend(tokens)
            mm.extend(flags)

        for piece in pieces:
            if piece == IMG_CONTEXT:
                k = image_counts[seen["images"]]
                add(self.img_start, [False] * len(self.img_start))
                spans.append(Placeholder("images", seen["images"], len(ids), k))
                add(self.img_context * k, [True] * k * len(self.img_context))
                add(self.img_end, [False] * len(self.img_end))
                seen["images"] += 1
            elif piece == VIDEO_PLACEHOLDER:
                repl = video_ids[seen["videos"]]
                spans.append(Placeholder("videos", seen["videos"], len(ids), len(repl)))
                add(repl, [True] * len(repl))  # every position: separators and tags too
                seen["videos"] += 1
            elif piece == AUDIO_CONTEXT:
                k = audio_counts[seen["audios"]]
                add(self.audio_start, [False] * len(self.audio_start))
                spans.append(Placeholder("audios", seen["audios"], len(ids), k))
                add(self.audio_context * k, [True] * k * len(self.audio_context))
                add(self.audio_end, [False] * len(self.audio_end))
                seen["audios"] += 1
            elif piece:
                tokens = self.tokenizer.encode(piece, add_special_tokens=False)
                add(tokens, [False] * len(tokens))
        return ids, mm, spans
