"""Configuration of the multimodal wrapper.

One dataclass flows top-down into every constructor. Field names follow the checkpoint's
top-level config (``force_image_size``, ``patch_size``, ``downsample_ratio``, ...); derived sizes
are computed in ``__post_init__`` so no module recomputes them.

This slice carries the fields the input layer, the connector and the video path read. The
language model (``text_config``), RADIO (``vision_config``) and Parakeet (``sound_config``)
configs arrive with the full reference model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from reference_impl.errors import FieldError


class ConfigError(FieldError):
    """A configuration field has an invalid value. The message names the field."""

    def __init__(self, field: str, expected: str, actual: object) -> None:
        super().__init__(f"config field {field!r}", expected, repr(actual))
        self.field_name = field


@dataclass(frozen=True)
class VLConfig:
    """The top-level Nano-Nemotron VL config, as far as the multimodal wrapper reads it.

    Attributes:
        hidden_size: the language model's width ``h`` (``text_config.hidden_size``).
        vocab_size: the language model's vocabulary size.
        vit_hidden_size: the vision tower's width ``C``.
        projector_hidden_size: the width of ``mlp1``'s hidden layer.
        force_image_size: the side ``S`` of a static tile, in pixels.
        patch_size: the vision patch side ``P``, in pixels.
        downsample_ratio: pixel-shuffle ratio; the shuffle factor is ``r = round(1 / ratio)``.
        ps_version: ``"v2"`` (normal) or ``"v1"`` (legacy, transposed output).
        video_temporal_patch_size: frames per tubelet ``T``; ``T > 1`` embeds tubelets.
        dynamic_resolution: images arrive at their own size (``min_num_patches`` in the
            vision args) instead of as ``S x S`` tiles.
        has_audio: the checkpoint carries a ``sound_config`` (an audio tower).
    """

    hidden_size: int
    vocab_size: int
    vit_hidden_size: int
    projector_hidden_size: int
    force_image_size: int = 512
    patch_size: int = 16
    downsample_ratio: float = 0.5
    ps_version: str = "v2"
    video_temporal_patch_size: int = 1
    dynamic_resolution: bool = False
    has_audio: bool = False
    # Derived in __post_init__.
    shuffle_factor: int = field(init=False)
    num_image_token: int = field(init=False)

    def __post_init__(self) -> None:
        for name in (
            "hidden_size",
            "vocab_size",
            "vit_hidden_size",
            "projector_hidden_size",
            "force_image_size",
            "patch_size",
            "video_temporal_patch_size",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(name, "a positive int", value)
        if not 0.0 < self.downsample_ratio <= 1.0:
            raise ConfigError("downsample_ratio", "a float in (0, 1]", self.downsample_ratio)
        r = round(1 / self.downsample_ratio)
        if not math.isclose(r * self.downsample_ratio, 1.0):
            raise ConfigError(
                "downsample_ratio", "the reciprocal of an integer", self.downsample_ratio
            )
        if self.ps_version not in ("v1", "v2"):
            raise ConfigError("ps_version", "'v1' or 'v2'", self.ps_version)
        if self.force_image_size % self.patch_size != 0:
            raise ConfigError(
                "force_image_size",
                f"a multiple of patch_size={self.patch_size}",
                self.force_image_size,
            )
        grid = self.force_image_size // self.patch_size
        if grid % r != 0:
            raise ConfigError(
                "force_image_size",
                f"a patch grid ({grid}) divisible by the shuffle factor {r}",
                self.force_image_size,
            )
        # Frozen dataclass: derived fields are set through object.__setattr__.
        object.__setattr__(self, "shuffle_factor", r)
        object.__setattr__(self, "num_image_token", (grid // r) ** 2)

    @property
    def connector_in_size(self) -> int:
        """Width of the pixel-shuffled features entering ``mlp1``: ``C * r * r``."""
        return self.vit_hidden_size * self.shuffle_factor**2

    def tokens_for_grid(self, height: int, width: int) -> int:
        """Embedding rows produced for an ``height x width`` pixel image or frame."""
        return (height // self.patch_size) * (width // self.patch_size) // self.shuffle_factor**2
