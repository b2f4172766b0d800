"""Requests drawn per parity path, for calibrating its bounds (:mod:`harness.jobs.calibrate`).

A bound derived from one fixed input would fit that input; each path here draws its media from a
seed over the range the request catalogue uses (image sides 32 to 160, one or two images; one to
six video frames, an even count at T = 2; audio clips of 0.3 to 2 s; EVS scenes that repeat in
whole groups, so that a bf16 target keeps the same tokens as the fp32 reference), on the
checkpoint variant the catalogue uses for the path (:data:`DRAWN_PATHS`).

``audio-in-video`` draws what a video file's track decodes to (a 16-bit tone at 16 kHz, 1 to 3 s)
and sends it as an audio item: vLLM's own audio-in-video route resamples the track twice (a
pinned deviation), and calibrating on it would widen the bound around that bug.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from harness.checkpoints.spec import ModelSpec
from harness.inputs.catalogue import DYNAMIC, EVS_T1, EVS_T2, HOP_128, MTP, NO_CONV_BIAS, STATIC
from harness.inputs.catalogue import TEMPORAL_2 as T2
from harness.inputs.media import audio_clip, pil_image, video_clip
from harness.inputs.media import video_of_scenes as scenes
from harness.inputs.requests import AUDIO_SAMPLE_RATE, Request, RequestModality

#: Six frames with exactly three scene starts: EVS at rate 0.5 keeps the three starts' groups.
EVS_T1_SCENES = ("ABBCCC", "AABBBC", "AAABBC", "ABBBCC", "AABCCC")
#: Four tubelets, one a repeat: EVS at rate 0.25 keeps the other three.
EVS_T2_SCENES = ("AABBBBCC", "AAAABBCC", "AABBCCCC")


def _images(spec: ModelSpec, rng: np.random.Generator) -> Request:
    count = int(rng.integers(1, 3))
    images = [
        pil_image(
            int(rng.integers(32, 161)), int(rng.integers(32, 161)), int(rng.integers(1 << 30))
        )
        for _ in range(count)
    ]
    return Request("Look: " + " and ".join(["<image>"] * count) + ".", images=images)


def _video(spec: ModelSpec, rng: np.random.Generator) -> Request:
    t = spec.video_temporal_patch_size
    frames = t * int(rng.integers(1, 6 // t + 1))
    return Request(
        "Watch <video>.", videos=[video_clip(frames, 64, 64, int(rng.integers(1 << 30)))]
    )


def _video_of_scenes(spec: ModelSpec, rng: np.random.Generator) -> Request:
    choices = EVS_T2_SCENES if spec.video_temporal_patch_size == 2 else EVS_T1_SCENES
    pattern = choices[int(rng.integers(len(choices)))]
    return Request("Watch <video>.", videos=[scenes(pattern, 64, 64, int(rng.integers(1 << 30)))])


def _audio(spec: ModelSpec, rng: np.random.Generator) -> Request:
    seconds = float(rng.uniform(0.3, 2.0))
    return Request("Hear <so_embedding>.", audios=[audio_clip(seconds, int(rng.integers(1 << 30)))])


def _track(spec: ModelSpec, rng: np.random.Generator) -> Request:
    seconds, tone_hz = float(rng.uniform(1.0, 3.0)), float(rng.uniform(300.0, 900.0))
    t = np.arange(round(seconds * AUDIO_SAMPLE_RATE)) / AUDIO_SAMPLE_RATE
    pcm = (0.3 * 32767 * np.sin(2 * np.pi * tone_hz * t)).astype(np.int16)
    return Request("Hear <so_embedding>.", audios=[(pcm / 32768.0).astype(np.float32)])


@dataclass(frozen=True)
class DrawnPath:
    """A parity path's checkpoint variant, the modality of its items, and its draw."""

    spec: ModelSpec
    modality: RequestModality
    draw: Callable[[ModelSpec, np.random.Generator], Request]

    def request(self, spec: ModelSpec, seed: int) -> Request:
        """The request drawn from ``seed`` for ``spec`` (the path's variant, perhaps saved in
        another dtype)."""
        return self.draw(spec, np.random.default_rng(seed))


#: Every parity path that a request reaches (the connector is given its features directly).
DRAWN_PATHS: dict[str, DrawnPath] = {
    "image-static": DrawnPath(STATIC, "image", _images),
    "image-dynamic": DrawnPath(DYNAMIC, "image", _images),
    "image-mtp": DrawnPath(MTP, "image", _images),
    "video-t1": DrawnPath(STATIC, "video", _video),
    "video-t2": DrawnPath(T2, "video", _video),
    "video-evs": DrawnPath(EVS_T1, "video", _video_of_scenes),
    "video-evs-t2": DrawnPath(EVS_T2, "video", _video_of_scenes),
    "audio-hop-160": DrawnPath(STATIC, "audio", _audio),
    "audio-hop-128": DrawnPath(HOP_128, "audio", _audio),
    "audio-no-conv-bias": DrawnPath(NO_CONV_BIAS, "audio", _audio),
    "audio-in-video": DrawnPath(STATIC, "audio", _track),
}


#: The connector's input: ``n`` tiles of a ``gh x gw`` patch grid, RADIO's width.
CONNECTOR_TILES, CONNECTOR_GRID, RADIO_WIDTH = 3, (4, 4), 384


def connector_features(seed: int) -> torch.Tensor:
    """``[n, gh*gw, C]`` vision features for the connector, bf16-representable (every target
    sees the same numbers)."""
    g = torch.Generator().manual_seed(seed)
    shape = (CONNECTOR_TILES, CONNECTOR_GRID[0] * CONNECTOR_GRID[1], RADIO_WIDTH)
    return torch.randn(shape, generator=g).bfloat16().float()
