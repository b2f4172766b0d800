"""What a serving engine asks of the processor before any request, answered from the config
alone: no tokenizer, no media, no processor built (building one reconfigures the tokenizer every
thread shares, vLLM PR #38655).

- which modalities the checkpoint takes and how many items of each per prompt;
- the keyword inputs of each modality the model takes (an engine routes them by modality);
- the most placeholder tokens one item can take, and the frames of the dummy video an engine
  profiles memory with.
"""

from __future__ import annotations

from reference_impl.config import VLConfig
from reference_impl.tiling import video_frame_size


def supports_video(config: VLConfig) -> bool:
    """Always (the metadata questions are answered from the config alone)."""
    return True


def supports_audio(config: VLConfig) -> bool:
    return config.has_audio


def is_dynamic_tiler(config: VLConfig) -> bool:
    return config.dynamic_resolution


#: The model's keyword inputs of each modality, as :mod:`reference_impl.processor` emits them
#: (routing keys and the helpers they need); a serving engine routes each to its modality.
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
    the videos in whole tubelets of ``T`` frames, each tubelet the tokens of one square frame
    a tile wide (:func:`~reference_impl.tiling.video_frame_size`: a tile's tokens, or a patch
    target's); at least one.
    """
    images = counts.get("image", 0)
    image_tokens = (
        images * max_tokens_per_item(config, seq_len, {"image": 1})["image"] if images else 0
    )
    side = config.force_image_size
    _, _, per_tubelet = video_frame_size(
        side,
        side,
        side,
        config.patch_size,
        config.downsample_ratio,
        config.video_target_num_patches,
        config.video_maintain_aspect_ratio,
    )
    tubelets = (seq_len - image_tokens) // per_tubelet // max(counts.get("video", 0), 1)
    return max(tubelets * config.video_temporal_patch_size, 1)
