"""The text the reference writes before each frame (or tubelet) of a video, against the
checkpoint's own processor as NVIDIA ported it into transformers
(``NemotronH_Omni_Reasoning_V3Processor.replace_video_token``, transformers 5.20).

That processor stamps frame ``i`` at ``frames_indices[i] * int(1000 / fps) / 1000`` seconds, two
decimals: the frame duration is truncated to whole milliseconds before it is multiplied, so at
frame rates whose frame duration is no whole number of milliseconds (24000/1001, 30000/1001, 60)
the stamps fall behind the source's presentation times (at 24000/1001 fps frame 1,439 of a clip
is stamped 59.00 s, presented at 60.02 s). The reference follows the processor, not the clock.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.inputs.strategies import REQUEST_BOUNDS
from reference_impl.video_replacement import frame_separators, frame_timestamps

omni = pytest.importorskip(
    "transformers.models.nemotron_h_omni.processing_nemotron_h_omni",
    reason="transformers before 5.20 has no port of the Omni checkpoint's processor",
)
video_utils = pytest.importorskip("transformers.video_utils")

GROUP = "<img>" + "<image>" * 3 + "</img>"


def checkpoint_separators(
    num_frames: int, fps: float, frames_indices: list[int], temporal_patch_size: int
) -> list[str]:
    """The separator texts the checkpoint's processor writes: its ``replace_video_token`` run on
    an instance holding only the fields it reads (building the whole processor needs the
    checkpoint's image and video processors), split at each group's tokens."""
    processor = object.__new__(omni.NemotronH_Omni_Reasoning_V3Processor)
    processor.image_start_token = "<img>"
    processor.image_token = "<image>"
    processor.image_end_token = "</img>"
    processor.video_temporal_patch_dim = temporal_patch_size
    metadata = video_utils.VideoMetadata(
        total_num_frames=max(frames_indices) + 1,
        fps=fps,
        frames_indices=frames_indices,
    )
    text = processor.replace_video_token(
        {"num_tokens": [3]}, 0, num_frames=num_frames, video_metadata=metadata
    )
    labels = text.split(GROUP)
    assert labels[-1] == "", f"the text does not end with a group: {text!r}"
    return labels[:-1]


@st.composite
def sampled_indices(draw: st.DrawFn) -> tuple[float, list[int]]:
    """A source frame rate and the frame indices a loader samples from a clip at it."""
    fps = draw(st.sampled_from([*REQUEST_BOUNDS.video_fps, 12.5, 24.0, 30.0, 50.0]))
    total = max(1, round(draw(st.floats(0.5, 600.0)) * fps))
    count = min(draw(st.integers(1, 17)), total)
    return fps, [int(i) for i in np.linspace(0, total - 1, count).astype(int)]


@given(clip=sampled_indices(), temporal_patch_size=st.sampled_from([1, 2]))
def test_frame_separators_are_the_checkpoint_processors(clip, temporal_patch_size):
    fps, indices = clip
    groups = -(-len(indices) // temporal_patch_size)
    ours = frame_separators(groups, indices, int(1000 / fps), temporal_patch_size)
    assert ours == checkpoint_separators(len(indices), fps, indices, temporal_patch_size)


def test_stamps_at_ntsc_rates_follow_whole_millisecond_frames():
    """By hand: at 24000/1001 fps a frame lasts 41.708 ms, written as 41; frame 1,439 is
    stamped 1439 * 41 / 1000 = 58.999 s, not its presentation time 60.018 s."""
    fps = 24000 / 1001
    assert frame_timestamps([1439], int(1000 / fps)) == [58.999]
    (separator,) = checkpoint_separators(1, fps, [1439], 1)
    assert separator == "Frame 1 sampled at 59.00 seconds: "
