"""Typed multimodal input contracts and their runtime validation.

Glossary of the symbolic dimensions (bound across the fields of one contract):

    n   items (images, videos or audio clips' parent audios) in the batch
    t   static image tiles, summed over the images (thumbnail tiles included)
    v   video frames, summed over the videos
    f   embedding rows of one item (its placeholder count)
    h   the language model's hidden size
    s   side of a tile or frame, in pixels (``H`` and ``W`` when they may differ)
    c   audio clips, summed over the audios
    l   audio feature frames of one clip (padded)
    m   mel bins

Each contract is a frozen dataclass with a ``kind`` discriminator (the same strings vLLM's
``TensorSchema`` classes use for ``type``) and a ``validate`` that raises
:class:`InputValidationError` naming the field, the expected and the actual value. Validation is
strict where upstream is silent: a wrong rank or dtype, a dimension that disagrees across fields,
or embeddings whose width is not the language model's hidden size are rejected at the boundary
instead of failing later in the merge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias, TypedDict

import torch

from reference_impl.errors import FieldError


class InputValidationError(FieldError):
    """A multimodal input does not satisfy its contract. The message names the field."""


def describe(value: object) -> str:
    """A short description of a value for error messages: shape and dtype for tensors."""
    if isinstance(value, torch.Tensor):
        return f"tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of length {len(value)}"
    return f"{type(value).__name__} {value!r}"


class ShapeBinder:
    """Checks tensor ranks and binds symbolic dimension names across the fields of one contract.

    ``check("pixel_values_flat", x, ("t", 3, "s", "s"))`` requires rank 4 and a literal 3 in
    dimension 1, binds ``t`` and ``s`` on first sight, and raises when a later field (or a later
    dimension of the same field) disagrees with an earlier binding.
    """

    def __init__(self, **bound: int) -> None:
        self.bound: dict[str, int] = dict(bound)
        self.source: dict[str, str] = {name: "the model config" for name in bound}

    def check(self, field: str, value: object, dims: Sequence[int | str]) -> torch.Tensor:
        if not isinstance(value, torch.Tensor):
            raise InputValidationError(field, f"a tensor of shape {_fmt(dims)}", describe(value))
        if value.ndim != len(dims):
            raise InputValidationError(
                field,
                f"rank {len(dims)} (shape {_fmt(dims)})",
                f"rank {value.ndim} (shape {tuple(value.shape)})",
            )
        for axis, (dim, size) in enumerate(zip(dims, value.shape, strict=True)):
            if isinstance(dim, int):
                if size != dim:
                    raise InputValidationError(
                        f"{field}.shape[{axis}]", f"{dim} (shape {_fmt(dims)})", size
                    )
            elif dim in self.bound:
                if size != self.bound[dim]:
                    raise InputValidationError(
                        f"{field}.shape[{axis}]",
                        f"{dim}={self.bound[dim]} as bound by {self.source[dim]}",
                        size,
                    )
            else:
                self.bound[dim] = int(size)
                self.source[dim] = f"{field}.shape[{axis}]"
        return value

    def bind(self, field: str, name: str, size: int) -> None:
        """Bind ``name`` to ``size`` (a count taken from a non-tensor field), or check it."""
        if name in self.bound and self.bound[name] != size:
            raise InputValidationError(
                field, f"{name}={self.bound[name]} as bound by {self.source[name]}", size
            )
        self.bound[name] = size
        self.source[name] = field


def _fmt(dims: Sequence[int | str]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _require_floating(field: str, x: torch.Tensor) -> None:
    if not x.is_floating_point():
        raise InputValidationError(field, "a floating-point dtype", x.dtype)


def _require_integer(field: str, x: torch.Tensor) -> None:
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise InputValidationError(field, "an integer dtype", x.dtype)


def int_list(field: str, value: object) -> list[int]:
    """Accept a list/tuple of ints or a 1-D integer tensor; return a list of ints."""
    if isinstance(value, torch.Tensor):
        _require_integer(field, value)
        if value.ndim != 1:
            raise InputValidationError(field, "a 1-D integer tensor", describe(value))
        return [int(v) for v in value.tolist()]
    if isinstance(value, (list, tuple)) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return list(value)
    raise InputValidationError(field, "a list of ints or a 1-D integer tensor", describe(value))


def _positive(field: str, values: Sequence[int]) -> None:
    for i, v in enumerate(values):
        if v < 1:
            raise InputValidationError(f"{field}[{i}]", "a positive count", v)


# ---------------------------------------------------------------------------------------------
# Images


@dataclass(frozen=True)
class ImagePixelInputs:
    """Static tiles: ``pixel_values_flat [t, 3, s, s]`` with ``num_patches [n]`` tiles per image."""

    pixel_values_flat: torch.Tensor
    num_patches: list[int]
    kind: Literal["pixel_values"] = "pixel_values"

    @property
    def num_items(self) -> int:
        return len(self.num_patches)

    def validate(self, tile_size: int | None = None) -> None:
        dims = ShapeBinder() if tile_size is None else ShapeBinder(s=tile_size)
        dims.check("pixel_values_flat", self.pixel_values_flat, ("t", 3, "s", "s"))
        _require_floating("pixel_values_flat", self.pixel_values_flat)
        _positive("image_num_patches", self.num_patches)
        dims.bind("sum(image_num_patches)", "t", sum(self.num_patches))


@dataclass(frozen=True)
class ImagePixelDynamicInputs:
    """Dynamic resolution: one ``[3, H_i, W_i]`` image each, with its size and token count."""

    pixel_values: list[torch.Tensor]
    imgs_sizes: list[tuple[int, int]]
    num_tokens_per_image: list[int]
    kind: Literal["pixel_values_dynamic"] = "pixel_values_dynamic"

    @property
    def num_items(self) -> int:
        return len(self.pixel_values)

    def validate(self, patch_size: int, shuffle_factor: int) -> None:
        dims = ShapeBinder()
        dims.bind("pixel_values_flat", "n", len(self.pixel_values))
        dims.bind("imgs_sizes", "n", len(self.imgs_sizes))
        dims.bind("num_tokens_per_image", "n", len(self.num_tokens_per_image))
        step = patch_size * shuffle_factor
        for i, (image, size) in enumerate(zip(self.pixel_values, self.imgs_sizes, strict=True)):
            field = f"pixel_values_flat[{i}]"
            ShapeBinder(H=size[0], W=size[1]).check(field, image, (3, "H", "W"))
            _require_floating(field, image)
            if size[0] % step or size[1] % step:
                raise InputValidationError(
                    f"imgs_sizes[{i}]",
                    f"(H, W) multiples of patch_size*{shuffle_factor}={step}",
                    size,
                )
            tokens = (size[0] // patch_size) * (size[1] // patch_size) // shuffle_factor**2
            if self.num_tokens_per_image[i] != tokens:
                raise InputValidationError(
                    f"num_tokens_per_image[{i}]",
                    f"{tokens} for an image of size {size}",
                    self.num_tokens_per_image[i],
                )


@dataclass(frozen=True)
class _EmbeddingInputs:
    """Precomputed embeddings: a stacked ``[n, f, h]`` tensor or a list of ``[f_i, h]``."""

    data: torch.Tensor | list[torch.Tensor]
    kind: str = ""  # the routing key, and the name errors use (each subclass fixes it)

    @property
    def num_items(self) -> int:
        return len(self.data)

    def validate(self, hidden_size: int | None = None) -> None:
        _validate_embeddings(self.kind, self.data, hidden_size)


@dataclass(frozen=True)
class ImageEmbeddingInputs(_EmbeddingInputs):
    """Precomputed image embeddings, one ``[f_i, h]`` per image."""

    kind: Literal["image_embeds"] = "image_embeds"


ImageInputs: TypeAlias = ImagePixelInputs | ImagePixelDynamicInputs | ImageEmbeddingInputs

# ---------------------------------------------------------------------------------------------
# Videos


@dataclass(frozen=True)
class VideoPixelInputs:
    """Frames of every video: ``pixel_values_flat [v, 3, H, W]``, ``num_frames [n]`` per video;
    when the videos' frames differ in size (resized keeping each video's aspect ratio), one
    ``[f_i, 3, H_i, W_i]`` tensor per video instead.

    ``frames_indices [v]`` are the frames' original indices, ``frame_duration_ms [n]`` each video's
    frame duration (the separator text carries the timestamps they give).
    """

    pixel_values_flat: torch.Tensor | list[torch.Tensor]
    num_frames: list[int]
    frames_indices: list[int]
    frame_duration_ms: list[int]
    kind: Literal["pixel_values_videos"] = "pixel_values_videos"

    @property
    def num_items(self) -> int:
        return len(self.num_frames)

    def per_video(self) -> list[torch.Tensor]:
        """Each video's ``[f_i, 3, H_i, W_i]`` frames."""
        if isinstance(self.pixel_values_flat, list):
            return self.pixel_values_flat
        return list(torch.split(self.pixel_values_flat, self.num_frames))

    def validate(self, patch_size: int, shuffle_factor: int) -> None:
        _positive("video_num_patches", self.num_frames)
        dims = ShapeBinder()
        if isinstance(self.pixel_values_flat, list):
            videos = self.pixel_values_flat
            dims.bind("pixel_values_flat_video", "n", len(videos))
            for i, frames in enumerate(videos):
                name = f"pixel_values_flat_video[{i}]"
                ShapeBinder().check(name, frames, ("f", 3, "H", "W"))
                _require_floating(name, frames)
                if frames.shape[0] != self.num_frames[i]:
                    raise InputValidationError(
                        f"{name}.shape[0]",
                        f"video_num_patches[{i}]={self.num_frames[i]}",
                        frames.shape[0],
                    )
        else:
            videos = [self.pixel_values_flat]
            dims.check("pixel_values_flat_video", self.pixel_values_flat, ("v", 3, "H", "W"))
            _require_floating("pixel_values_flat_video", self.pixel_values_flat)
        dims.bind("sum(video_num_patches)", "v", sum(self.num_frames))
        dims.bind("frames_indices", "v", len(self.frames_indices))
        dims.bind("video_num_patches", "n", len(self.num_frames))
        dims.bind("frame_duration_ms", "n", len(self.frame_duration_ms))
        step = patch_size * shuffle_factor
        for frames in videos:
            h, w = frames.shape[-2:]
            if h % step or w % step:
                raise InputValidationError(
                    "pixel_values_flat_video.shape[-2:]",
                    f"multiples of patch_size*{shuffle_factor}={step}",
                    (h, w),
                )


@dataclass(frozen=True)
class VideoEmbeddingInputs(_EmbeddingInputs):
    """Precomputed video embeddings covering every placeholder of each video's replacement."""

    kind: Literal["video_embeds"] = "video_embeds"


VideoInputs: TypeAlias = VideoPixelInputs | VideoEmbeddingInputs

# ---------------------------------------------------------------------------------------------
# Audio


@dataclass(frozen=True)
class AudioFeatureInputs:
    """Log-mel features of every clip ``[c, l, m]``, the valid-frame mask ``[c, l]`` and the
    number of 30 s clips of each audio (``audio_num_clips [n]``, summing to ``c``)."""

    input_audio_features: torch.Tensor
    feature_attention_mask: torch.Tensor
    audio_num_clips: list[int]
    kind: Literal["audio_features"] = "audio_features"

    @property
    def num_items(self) -> int:
        return len(self.audio_num_clips)

    def validate(self, num_mel_bins: int | None = None) -> None:
        dims = ShapeBinder() if num_mel_bins is None else ShapeBinder(m=num_mel_bins)
        dims.check("input_audio_features", self.input_audio_features, ("c", "l", "m"))
        _require_floating("input_audio_features", self.input_audio_features)
        dims.check("feature_attention_mask", self.feature_attention_mask, ("c", "l"))
        if self.feature_attention_mask.is_floating_point():
            raise InputValidationError(
                "feature_attention_mask",
                "a bool or integer dtype",
                self.feature_attention_mask.dtype,
            )
        _positive("audio_num_clips", self.audio_num_clips)
        dims.bind("sum(audio_num_clips)", "c", sum(self.audio_num_clips))


class MultiModalInputs(TypedDict, total=False):
    """The parse result: one entry per modality present, in the order its first key appeared."""

    images: ImageInputs
    videos: VideoInputs
    audios: AudioFeatureInputs


# ---------------------------------------------------------------------------------------------


def _validate_embeddings(
    field: str, data: torch.Tensor | list[torch.Tensor], hidden_size: int | None
) -> None:
    dims = ShapeBinder() if hidden_size is None else ShapeBinder(h=hidden_size)
    if isinstance(data, torch.Tensor):
        dims.check(field, data, ("n", "f", "h"))
        _require_floating(field, data)
        return
    if not isinstance(data, (list, tuple)):
        raise InputValidationError(
            field, "a [n, f, h] tensor or a list of [f_i, h] tensors", describe(data)
        )
    if len(data) == 0:
        raise InputValidationError(field, "at least one item", "an empty list")
    for i, item in enumerate(data):
        # Each item has its own row count f_i; the width h is shared.
        dims.check(f"{field}[{i}]", item, (f"f{i}", "h"))
        _require_floating(f"{field}[{i}]", item)
