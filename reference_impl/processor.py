"""The processor's arithmetic: image tiling (static and dynamic resolution), video frame sizes,
frame separators and the video replacement ids.

Glossary: ``S`` tile side, ``P`` patch side, ``r`` shuffle factor (2), grids are
``(cols, rows)``.

The model rebuilds a video's replacement (separator text, ``<img>``, ``<image>`` x tokens,
``</img>`` per frame or tubelet) to fill the non-context positions with text embeddings, so
these must match what the processor put into the prompt.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedTokenizerBase

from reference_impl.audio import audio_token_count, extract_features, to_mono
from reference_impl.config import VLConfig
from reference_impl.errors import ConfigError
from reference_impl.evs import placeholder_tokens_per_group
from reference_impl.media import audio_track
from reference_impl.tokenizer import (
    AUDIO_CONTEXT,
    AUDIO_END,
    AUDIO_START,
    IMG_CONTEXT,
    IMG_END,
    IMG_START,
    VIDEO_PLACEHOLDER,
)


def frame_timestamps(frames_indices: Sequence[int], frame_duration_ms: int) -> list[float]:
    """Seconds at which each frame was sampled: ``index * duration_ms / 1000``."""
    return [int(i) * frame_duration_ms / 1000.0 for i in frames_indices]


def frame_separators(
    num_groups: int,
    frames_indices: Sequence[int],
    frame_duration_ms: int | None,
    temporal_patch_size: int = 1,
) -> list[str]:
    """The separator text before each frame (``T == 1``) or tubelet (``T > 1``).

    - ``T == 1``: ``"Frame {i+1} sampled at {ts:.2f} seconds: "``.
    - ``T > 1``: the tubelet's frames joined by ``" and "``, the first ``"Frame ..."``, later ones
      ``"frame ..."``, then ``": "``; frames past the end are not listed.
    - Without a frame duration: ``"Frame {i+1}: "``.

    Every separator after the first starts with a newline.
    """
    if frame_duration_ms is None:
        return [("\n" if i else "") + f"Frame {i + 1}: " for i in range(num_groups)]
    stamps = frame_timestamps(frames_indices, frame_duration_ms)
    t = temporal_patch_size
    if t == 1:
        return [
            ("\n" if i else "") + f"Frame {i + 1} sampled at {ts:.2f} seconds: "
            for i, ts in enumerate(stamps)
        ]
    separators = []
    for group, start in enumerate(range(0, len(stamps), t)):
        parts = [
            f"{'Frame' if k == start else 'frame'} {k + 1} sampled at {stamps[k]:.2f} seconds"
            for k in range(start, min(start + t, len(stamps)))
        ]
        separators.append(("\n" if group else "") + " and ".join(parts) + ": ")
    return separators


def video_replacement_ids(
    tokenizer: PreTrainedTokenizerBase,
    tokens_per_group: Sequence[int],
    frames_indices: Sequence[int],
    frame_duration_ms: int | None,
    temporal_patch_size: int = 1,
) -> list[int]:
    """Token ids replacing one ``<video>``: per group ``sep + <img> + <image>*k + </img>``.

    Separators are tokenised on their own and the tags use their pre-tokenised ids, so the count
    of non-context tokens does not depend on ``tokens_per_group``.
    """
    seps = frame_separators(
        len(tokens_per_group), frames_indices, frame_duration_ms, temporal_patch_size
    )
    if len(seps) != len(tokens_per_group):
        raise ValueError(
            f"tokens_per_group: expected {len(seps)} groups for {len(frames_indices)} frames "
            f"with T={temporal_patch_size}, got {len(tokens_per_group)}"
        )
    start = tokenizer.encode(IMG_START, add_special_tokens=False)
    end = tokenizer.encode(IMG_END, add_special_tokens=False)
    context = tokenizer.encode(IMG_CONTEXT, add_special_tokens=False)
    sep_ids: list[list[int]] = tokenizer(seps, add_special_tokens=False)["input_ids"]
    ids: list[int] = []
    for sep, k in zip(sep_ids, tokens_per_group, strict=True):
        ids += sep + start + context * k + end
    return ids


# ---------------------------------------------------------------------------------------------
# Images: static tiling (InternVL style)


def target_ratios(max_num_tiles: int, min_num_tiles: int = 1) -> list[tuple[int, int]]:
    """Every ``(cols, rows)`` grid with ``min <= cols*rows <= max`` tiles, by tile count."""
    grids = {
        (i, j)
        for i in range(1, max_num_tiles + 1)
        for j in range(1, max_num_tiles + 1)
        if min_num_tiles <= i * j <= max_num_tiles
    }
    return sorted(grids, key=lambda g: (g[0] * g[1], g))


def closest_grid(width: int, height: int, tile: int, max_num_tiles: int) -> tuple[int, int]:
    """The ``(cols, rows)`` grid whose aspect ratio is closest to the image's; on a tie the
    larger grid wins when the image has more than half its pixel area."""
    aspect = width / height
    best, best_diff = (1, 1), float("inf")
    for cols, rows in target_ratios(max_num_tiles):
        diff = abs(aspect - cols / rows)
        if diff < best_diff:
            best, best_diff = (cols, rows), diff
        elif diff == best_diff and width * height > 0.5 * tile * tile * cols * rows:
            best = (cols, rows)
    return best


def num_static_tiles(
    width: int, height: int, tile: int, max_num_tiles: int, use_thumbnail: bool
) -> int:
    """Tiles of an image, the thumbnail included (it is added when the grid has > 1 tile)."""
    cols, rows = closest_grid(width, height, tile, max_num_tiles)
    return cols * rows + (1 if use_thumbnail and cols * rows > 1 else 0)


def resize_normalize(
    image: torch.Tensor, height: int, width: int, mean: Sequence[float], std: Sequence[float]
) -> torch.Tensor:
    """``[n, 3, H, W]`` pixel values in 0..255 to ``[n, 3, height, width]``: bicubic with
    antialiasing (skipped when the size already matches), ``/255``, then ``(x - mean) / std``."""
    x = image.float()
    if tuple(x.shape[-2:]) != (height, width):
        x = torch.nn.functional.interpolate(
            x, size=(height, width), mode="bicubic", align_corners=False, antialias=True
        )
    m = torch.tensor(mean, dtype=torch.float32).reshape(1, 3, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).reshape(1, 3, 1, 1)
    return (x / 255.0 - m) / s


def tile_image(
    image: torch.Tensor,
    tile: int,
    max_num_tiles: int,
    use_thumbnail: bool,
    mean: Sequence[float],
    std: Sequence[float],
) -> torch.Tensor:
    """One ``[3, H, W]`` image (0..255) to ``[t, 3, S, S]`` tiles, row-major, thumbnail last."""
    height, width = image.shape[-2:]
    cols, rows = closest_grid(width, height, tile, max_num_tiles)
    resized = resize_normalize(image[None], rows * tile, cols * tile, mean, std)[0]
    tiles = resized.reshape(3, rows, tile, cols, tile).permute(1, 3, 0, 2, 4)
    tiles = tiles.reshape(rows * cols, 3, tile, tile)
    if use_thumbnail and rows * cols > 1:
        tiles = torch.cat([tiles, resize_normalize(image[None], tile, tile, mean, std)])
    return tiles


# ---------------------------------------------------------------------------------------------
# Images: dynamic resolution (a patch budget per request)


def dynamic_grid(
    width: int, height: int, budget: int, patch: int, min_patches: int, factor_max: float = 1.0
) -> tuple[int, int]:
    """``(cols, rows)`` in patches for one image under a budget of ``budget`` patches: scale
    the image's patch grid to fit (never up beyond ``factor_max``), raise it to
    ``min_patches``, then round each side to an even count (up if that still fits)."""
    rows0 = round(height / patch + 0.5)
    cols0 = round(width / patch + 0.5)
    factor = min(math.sqrt(budget / (rows0 * cols0)), factor_max)
    # At least one patch per side: vLLM 0.33.0 floors a very thin image's short side to 0 and
    # then divides by zero (ZeroDivisionError); here it keeps one patch.
    rows, cols = max(1, math.floor(factor * rows0)), max(1, math.floor(factor * cols0))
    if budget > min_patches and rows * cols < min_patches:
        up = math.sqrt(min_patches / (rows * cols))
        rows, cols = math.ceil(up * rows), math.ceil(up * cols)
    if rows % 2:
        rows = rows + 1 if (rows + 1) * cols <= budget else max(2, rows - 1)
    if cols % 2:
        cols = cols + 1 if rows * (cols + 1) <= budget else max(2, cols - 1)
    return cols, rows


def dynamic_grids(
    sizes: Sequence[tuple[int, int]],
    tokens_available: int,
    patch: int,
    min_patches: int,
    max_patches: int,
) -> list[tuple[int, int]]:
    """Patch grids for every image of a request sharing ``tokens_available`` embedding tokens
    (4 patches per token after the pixel shuffle); over budget, each image's share is scaled
    down, at most 10 rounds."""
    cap = max_patches if max_patches > 0 else math.inf
    total = max(tokens_available * 4, min_patches * len(sizes))
    shares = [int(max(min(total, cap), min_patches)) for _ in sizes]
    for _ in range(10):
        grids = [
            dynamic_grid(w, h, share, patch, min_patches)
            for (w, h), share in zip(sizes, shares, strict=True)
        ]
        used = [c * r for c, r in grids]
        if sum(used) <= total:
            return grids
        scale = total / sum(used)
        scaled = [max(min_patches, int(u * scale)) for u in used]
        shares = (
            scaled
            if any(s < old for s, old in zip(scaled, shares, strict=True))
            else ([min_patches] * len(sizes))
        )
    raise ValueError(f"images: no patch grids fit {tokens_available} tokens for sizes {sizes}")


# ---------------------------------------------------------------------------------------------
# Video frames


def video_frame_size(
    width: int,
    height: int,
    tile: int,
    patch: int,
    downsample_ratio: float,
    target_num_patches: int | None,
    maintain_aspect_ratio: bool,
) -> tuple[int, int, int]:
    """``(width, height, tokens_per_frame)`` of resized frames: ``S x S`` by default; with a
    patch target, a square of that many patches or an aspect-preserving grid (each side a
    multiple of the shuffle factor, rounded up when that still fits)."""
    r = round(1 / downsample_ratio)
    if target_num_patches is None:
        w = h = tile
    elif maintain_aspect_ratio:
        aspect = width / max(height, 1)
        ph = max(1, round(math.sqrt(target_num_patches / aspect)))
        pw = max(1, round(math.sqrt(target_num_patches * aspect)))
        if r > 1:
            up_h, up_w = ph + (-ph) % r, pw + (-pw) % r
            if up_h * up_w <= target_num_patches:
                ph, pw = up_h, up_w
            else:
                ph, pw = max(r, ph - ph % r), max(r, pw - pw % r)
        w, h = pw * patch, ph * patch
    else:
        side = max(r, int(math.sqrt(target_num_patches)) // r * r)
        w = h = side * patch
    tokens = int((h // patch) * downsample_ratio) * int((w // patch) * downsample_ratio)
    return w, h, tokens


# ---------------------------------------------------------------------------------------------
# The processor: prompt expansion and the model's keyword arguments


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


_PLACEHOLDER = re.compile(
    f"({re.escape(IMG_CONTEXT)}|{re.escape(VIDEO_PLACEHOLDER)}|{re.escape(AUDIO_CONTEXT)})"
)


def supports_video(config: VLConfig) -> bool:
    """Always (the metadata questions are answered from the config alone)."""
    return True


def supports_audio(config: VLConfig) -> bool:
    return config.has_audio


def is_dynamic_tiler(config: VLConfig) -> bool:
    return config.dynamic_resolution


#: The model's keyword inputs of each modality, as this processor emits them (routing keys and
#: the helpers they need); a serving engine routes each to its modality.
MODEL_INPUT_KEYS: dict[str, tuple[str, ...]] = {
    "image": (
        "pixel_values_flat",
        "image_num_patches",
        "imgs_sizes",
        "num_tokens_per_image",
        "image_embeds",
    ),
    "video": (
        "pixel_values_flat_video",
        "video_num_patches",
        "frames_indices",
        "frame_duration_ms",
        "video_embeds",
    ),
    "audio": ("input_audio_features", "feature_attention_mask", "audio_num_clips"),
}


def supported_limits(config: VLConfig) -> dict[str, int | None]:
    """Items per prompt of each modality the checkpoint takes (None: no limit of its own)."""
    limits: dict[str, int | None] = {"image": None, "video": None}
    if supports_audio(config):
        limits["audio"] = None
    return limits


def max_tokens_per_item(config: VLConfig, seq_len: int, counts: dict[str, int]) -> dict[str, int]:
    """The most placeholder tokens one item of each modality in ``counts`` can take.

    Static tiles: the most tiles (``max_num_tiles``, plus the thumbnail when an image can
    tile) times the tokens per tile. Dynamic resolution: ``max_num_patches`` patches after the
    pixel shuffle (when the config caps them), else the whole sequence. Videos and audio have
    no cap but the sequence."""
    out: dict[str, int] = {}
    if counts.get("image", 0) > 0:
        if not config.dynamic_resolution:
            tiles = config.max_num_tiles + (config.use_thumbnail and config.max_num_tiles > 1)
            out["image"] = tiles * config.num_image_token
        elif config.max_num_patches > 0:
            out["image"] = min(seq_len, config.max_num_patches // config.shuffle_factor**2)
        else:
            out["image"] = seq_len
    if counts.get("video", 0) > 0:
        out["video"] = seq_len
    if counts.get("audio", 0) > 0 and supports_audio(config):
        out["audio"] = seq_len
    return out


def profiling_video_frames(config: VLConfig, seq_len: int, counts: dict[str, int]) -> int:
    """Frames per video of the dummy request an engine profiles memory with: the sequence less
    the images' most tokens (:func:`max_tokens_per_item`, static tiles), shared equally among
    the videos in whole tubelets of ``T`` frames, each tubelet one tile's tokens; at least one.
    """
    images = counts.get("image", 0)
    image_tokens = (
        images * max_tokens_per_item(config, seq_len, {"image": 1})["image"] if images else 0
    )
    tubelets = (seq_len - image_tokens) // config.num_image_token // max(counts.get("video", 0), 1)
    return max(tubelets * config.video_temporal_patch_size, 1)


def _image_tensor(image: object, index: int) -> torch.Tensor:
    """An ``[H, W, 3]`` RGB image (uint8 or 0..255 floats) as float ``[3, H, W]``."""
    x = torch.as_tensor(image)
    if x.ndim != 3 or x.shape[-1] != 3:
        raise ConfigError(f"images[{index}]", "an RGB image [H, W, 3]", tuple(x.shape))
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ConfigError(f"images[{index}]", "a non-empty image", tuple(x.shape))
    return x.permute(2, 0, 1).float()


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

    # -- per modality -------------------------------------------------------------------

    def _images(
        self, images: Sequence[object], text: str, max_num_tiles: int
    ) -> tuple[dict[str, object], list[int]]:
        c = self.config
        pixels = [_image_tensor(image, i) for i, image in enumerate(images)]
        if not c.dynamic_resolution:
            tiles = [
                tile_image(
                    p, c.force_image_size, max_num_tiles, c.use_thumbnail, c.norm_mean, c.norm_std
                )
                for p in pixels
            ]
            counts = [len(t) * c.num_image_token for t in tiles]
            return {
                "pixel_values_flat": torch.cat(tiles),
                "image_num_patches": torch.tensor([len(t) for t in tiles]),
            }, counts
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

    def _videos(self, videos: Sequence[Video]) -> tuple[dict[str, object], list[list[int]]]:
        c = self.config
        pixels, counts, indices, durations, replacements = [], [], [], [], []
        for i, video in enumerate(videos):
            frames = torch.as_tensor(video.frames)
            if frames.ndim != 4 or frames.shape[-1] != 3:
                raise ConfigError(
                    f"videos[{i}].frames", "RGB frames [F, H, W, 3]", tuple(frames.shape)
                )
            if frames.shape[0] == 0:
                raise ConfigError(f"videos[{i}].frames", "at least one frame", "0 frames")
            if video.fps <= 0:
                raise ConfigError(f"videos[{i}].fps", "a positive frame rate", video.fps)
            index = (
                list(video.frames_indices)
                if video.frames_indices is not None
                else list(range(frames.shape[0]))
            )
            if len(index) != frames.shape[0]:
                raise ConfigError(
                    f"videos[{i}].frames_indices",
                    f"one index per frame ({frames.shape[0]})",
                    len(index),
                )
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
        sizes = {tuple(p.shape[-2:]) for p in pixels}
        if len(sizes) > 1:
            raise ConfigError("videos", "frames of one size in one request", sorted(sizes))
        return {
            "pixel_values_flat_video": torch.cat(pixels),
            "video_num_patches": torch.tensor(counts),
            "frames_indices": torch.cat(indices),
            "frame_duration_ms": torch.tensor(durations),
        }, replacements

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

        ``image_embeds`` / ``video_embeds``: precomputed ``[f, h]`` embeddings in place of images
        or videos (not both forms of one modality in one request); an image's ``f`` rows fill
        ``<img>`` + ``f`` context tokens + ``</img>``, a video's fill ``f`` context tokens.

        ``audio_in_video``: each video's audio track is an audio item too, its placeholder right
        after the video's (:meth:`_audio_from_videos`).
        """
        c = self.config
        if audio_in_video:
            text, audios = self._audio_from_videos(text, videos, video_embeds, audios)
        images_given: Sequence[object] = images or image_embeds
        videos_given: Sequence[object] = videos or video_embeds
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
        for name, embeds in (("image_embeds", image_embeds), ("video_embeds", video_embeds)):
            for i, e in enumerate(embeds):
                if not isinstance(e, torch.Tensor) or e.ndim != 2 or e.shape[1] != c.hidden_size:
                    got = tuple(e.shape) if isinstance(e, torch.Tensor) else type(e).__name__
                    raise ConfigError(f"{name}[{i}]", f"a [f, {c.hidden_size}] tensor", got)
        max_tiles = c.max_num_tiles if max_num_tiles is None else max_num_tiles
        if not 1 <= max_tiles <= c.max_num_tiles:
            raise ConfigError(
                "max_num_tiles", f"1..{c.max_num_tiles} (the config's limit)", max_tiles
            )
        pieces = _PLACEHOLDER.split(text)
        found = {
            IMG_CONTEXT: pieces.count(IMG_CONTEXT),
            VIDEO_PLACEHOLDER: pieces.count(VIDEO_PLACEHOLDER),
            AUDIO_CONTEXT: pieces.count(AUDIO_CONTEXT),
        }
        for token, items, name in (
            (IMG_CONTEXT, images_given, "images"),
            (VIDEO_PLACEHOLDER, videos_given, "videos"),
            (AUDIO_CONTEXT, audios, "audios"),
        ):
            if found[token] != len(items):
                raise ConfigError(
                    name,
                    f"one item per {token} in the prompt ({found[token]})",
                    f"{len(items)} items",
                )
        if audios and not c.has_audio:
            raise ConfigError("audios", "none (this model has no sound_config)", len(audios))
        kwargs: dict[str, object] = {}
        image_counts: list[int] = []
        video_ids: list[list[int]] = []
        audio_counts: list[int] = []
        if images:
            image_kwargs, image_counts = self._images(images, text, max_tiles)
            kwargs.update(image_kwargs)
        if image_embeds:
            kwargs["image_embeds"] = list(image_embeds)
            image_counts = [int(e.shape[0]) for e in image_embeds]
        if videos:
            video_kwargs, video_ids = self._videos(videos)
            kwargs.update(video_kwargs)
        if video_embeds:
            kwargs["video_embeds"] = list(video_embeds)
            video_ids = [self.img_context * int(e.shape[0]) for e in video_embeds]
        if audios:
            assert c.sound_config is not None, "has_audio without a sound_config"
            features, mask, clips = extract_features(audios, c.sound_config)
            kwargs.update(
                input_audio_features=features, feature_attention_mask=mask, audio_num_clips=clips
            )
            audio_counts = [
                audio_token_count(len(to_mono(a, i)), c.sound_config) for i, a in enumerate(audios)
            ]
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
        return ProcessorOutput(ids, mm, spans, kwargs, image_counts)
