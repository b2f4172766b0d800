"""Recording test doubles for the vision and audio towers.

They compute deterministic features from their inputs (a seeded linear map of the pixel patches
or mel frames), so an output can be traced back to the item it came from, and they record every
call in an :class:`EncoderCalls`, so a suite can tell whether an encoder ran.

Two faces over one core: :class:`FakeVisionTower` speaks the reference wrapper's ``VisionTower``
protocol; :class:`FakeRadioModel` speaks vLLM's ``RadioModel`` calling convention
(``forward(pixel_values, num_frames=..., imgs_sizes=...) -> (summary, features)``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from harness.targets.base import EncoderCalls, ShellSpec
from reference_impl.config import VLConfig
from reference_impl.connector import build_mlp1


def seeded_mlp1(config: VLConfig, seed: int = 99) -> nn.Sequential:
    """``mlp1`` with weights drawn from ``seed``: every shell of a spec has the same connector,
    whatever the device or the global RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_mlp1(config)


def _seeded_linear(in_features: int, out_features: int, seed: int) -> nn.Linear:
    layer = nn.Linear(in_features, out_features, bias=False)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(out_features, in_features, generator=g) / in_features**0.5)
    return layer


def patchify(images: torch.Tensor, patch: int) -> torch.Tensor:
    """``[n, 3, H, W]`` to ``[n, (H/P)*(W/P), 3*P*P]`` (row-major patches)."""
    n, c, h, w = images.shape
    x = images.reshape(n, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(n, (h // patch) * (w // patch), c * patch * patch)


class FakeVisionCore(nn.Module):
    """Pixels to patch features with a fixed random projection; tubelets average their frames."""

    def __init__(self, spec: ShellSpec, calls: EncoderCalls, seed: int = 1234) -> None:
        super().__init__()
        self.spec = spec
        self.calls = calls
        self.embedder = _seeded_linear(3 * spec.patch_size**2, spec.vit_hidden_size, seed)

    def tiles(self, pixel_values: torch.Tensor) -> torch.Tensor:
        patches = patchify(pixel_values, self.spec.patch_size).to(self.embedder.weight)
        out: torch.Tensor = self.embedder(patches)
        return out

    def tubelets(self, frames: torch.Tensor, t: int) -> torch.Tensor:
        pad = math.ceil(len(frames) / t) * t - len(frames)
        if pad:  # repeat the last frame, as RADIO does
            frames = torch.cat([frames, frames[-1:].expand(pad, *frames.shape[1:])])
        per_frame = self.tiles(frames)
        return per_frame.reshape(-1, t, *per_frame.shape[1:]).mean(1)


class FakeVisionTower(nn.Module):
    """The reference wrapper's ``VisionTower`` protocol over a :class:`FakeVisionCore`."""

    def __init__(self, core: FakeVisionCore) -> None:
        super().__init__()
        self.core = core

    def forward_tiles(self, pixel_values: torch.Tensor) -> torch.Tensor:
        self.core.calls.vision.append("tiles")
        return self.core.tiles(pixel_values)

    def forward_video(self, frames: torch.Tensor, temporal_patch_size: int) -> torch.Tensor:
        self.core.calls.vision.append("video")
        return self.core.tubelets(frames, temporal_patch_size)

    def forward_dynamic(self, images: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        self.core.calls.vision.append("dynamic")
        return [self.core.tiles(image.unsqueeze(0))[0] for image in images]


class FakeRadioModel(nn.Module):
    """vLLM's ``RadioModel`` calling convention over a :class:`FakeVisionCore`."""

    def __init__(self, core: FakeVisionCore) -> None:
        super().__init__()
        self.core = core

    def forward(
        self,
        pixel_values: torch.Tensor,
        num_frames: int | None = None,
        imgs_sizes: list[tuple[int, int]] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        core = self.core
        if imgs_sizes is not None:
            # Already patchified by DynamicResolutionImageTiler.stack: [1, patches, 3*P*P].
            core.calls.vision.append("dynamic")
            features = core.embedder(pixel_values.to(core.embedder.weight))
        elif num_frames is not None:
            core.calls.vision.append("video")
            features = core.tubelets(pixel_values, core.spec.video_temporal_patch_size)
        else:
            core.calls.vision.append("tiles")
            features = core.tiles(pixel_values)
        summary = features.mean(1)
        return summary, features


class _Subsampler(nn.Module):
    def __init__(self, stride: int) -> None:
        super().__init__()
        self.stride = stride

    def _get_subsampling_output_length(self, lengths: torch.Tensor) -> torch.Tensor:
        # The name is vLLM's (ProjectedParakeet.encoder is transformers' ParakeetEncoder).
        return torch.div(lengths + self.stride - 1, self.stride, rounding_mode="floor")


class FakeSoundEncoder(nn.Module):
    """Mel frames to ``hidden_size`` embeddings, subsampled in time by ``audio_subsampling``.

    Serves both faces: ``forward(features, mask)`` and ``output_lengths`` for the reference, and
    ``encoder._get_subsampling_output_length`` for vLLM's ``ProjectedParakeet`` convention.
    """

    def __init__(self, spec: ShellSpec, calls: EncoderCalls, seed: int = 4321) -> None:
        super().__init__()
        self.calls = calls
        self.encoder = _Subsampler(spec.audio_subsampling)
        self.proj = _seeded_linear(spec.num_mel_bins, spec.hidden_size, seed)

    def forward(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self.calls.audio.append(int(features.shape[0]))
        x = features[:, :: self.encoder.stride] * mask[:, :: self.encoder.stride, None]
        out: torch.Tensor = self.proj(x.to(self.proj.weight))
        return out

    def output_lengths(self, input_lengths: torch.Tensor) -> torch.Tensor:
        return self.encoder._get_subsampling_output_length(input_lengths)
