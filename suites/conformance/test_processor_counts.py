"""Processor arithmetic on every target: the counts that size the prompt's placeholders.

Static tile counts and audio token counts, asked of the target's processor for the default
checkpoint folder (64 px tiles, thumbnail on; hop 160, subsampling 8), must equal tables worked
out by hand from the architecture's rules (below; not from any implementation, so the reference
target is checked too); the dynamic-resolution tiler must give every image a usable patch grid,
thin images included (no division by zero, no 0-patch side).
"""

from __future__ import annotations

import pytest

from harness.checkpoints.spec import ModelSpec

pytestmark = pytest.mark.concern("processor")

#: Static tiles (thumbnail included) by image size (width, height) and max_tiles 1, 6, 12, worked
#: by hand. The rule: among the grids of c x r tiles with c * r <= max_tiles (in order of c * r),
#: take the one whose c / r is closest to width / height; on a tie, a later grid only when the
#: image's area exceeds half that grid's pixel area (64 px tiles: never for these sizes); add
#: one thumbnail tile when the grid has more than one tile.
#:   (88, 38): 2.32 -> 2/1 (6; 2+1 = 3), 5/2 (12; 10+1 = 11)
#:   (42, 97): 0.43 -> 1/2 (6; 2+1 = 3), 2/5 (12; 10+1 = 11)
#:   (128, 65): 1.97 -> 2/1 for 6 and 12 (4/2 ties at 12, but the area 8320 is not over half of
#:   4 * 2 * 64 * 64 = 32768): 3
#:   (2, 375) and (375, 5): the extreme grid 1/6, 6/1 (7) and 1/12, 12/1 (13)
#:   (1, 1) and (64, 64): 1/1 (one tile, no thumbnail)
STATIC_TILES = {
    (1, 1): {1: 1, 6: 1, 12: 1},
    (2, 375): {1: 1, 6: 7, 12: 13},
    (88, 38): {1: 1, 6: 3, 12: 11},
    (64, 64): {1: 1, 6: 1, 12: 1},
    (128, 65): {1: 1, 6: 3, 12: 3},
    (375, 5): {1: 1, 6: 7, 12: 13},
    (42, 97): {1: 1, 6: 3, 12: 11},
}
#: Audio placeholders by sample count, worked by hand (16 kHz, 30 s clips, a last clip of at
#: least 0.1 s = 1600 samples; frames = clip // 160; three stride-2 kernel-3 convolutions:
#: L -> floor((L - 1) / 2 + 1) three times):
#:   1 and 1600 samples: one 1600-sample clip, 10 frames -> 5 -> 3 -> 2
#:   16000: 100 -> 50 -> 25 -> 13;  480000 (30 s): 3000 -> 1500 -> 750 -> 375
#:   480001: 375 + a 1600-sample clip (2) = 377
#:   976005 (61 s + 5): 375 + 375 + 16005 samples (100 frames: 13) = 763
AUDIO_TOKENS = {1: 2, 1600: 2, 16000: 13, 480000: 375, 480001: 377, 16000 * 61 + 5: 763}


@pytest.fixture(autouse=True)
def _default_checkpoint():
    """The hand-worked tables assume these fields of the default checkpoint folder."""
    config = ModelSpec().vl_config()
    assert config.force_image_size == 64
    assert config.use_thumbnail
    sound = config.sound_config
    assert sound is not None
    assert (sound.sampling_rate, sound.hop_length, sound.subsampling_factor) == (16000, 160, 8)
    assert (sound.subsampling_conv_kernel_size, sound.subsampling_conv_stride) == (3, 2)


@pytest.mark.parametrize(("width", "height"), STATIC_TILES)
@pytest.mark.parametrize("max_tiles", [1, 6, 12])
def test_static_tile_counts(target, width, height, max_tiles):
    counts = target.processor_counts()
    assert counts.static_tiles(width, height, max_tiles) == STATIC_TILES[width, height][max_tiles]


@pytest.mark.parametrize("samples", AUDIO_TOKENS)
def test_audio_token_counts(target, samples):
    assert target.processor_counts().audio_tokens(samples) == AUDIO_TOKENS[samples]


@pytest.mark.parametrize(
    ("sizes", "budget"),
    [
        ([(640, 480), (480, 640)], 1024),
        ([(1470, 5)], 2768),  # a very thin image
        ([(16, 545)], 16),  # a thin image under a tight budget
    ],
    ids=["two-images", "very-thin-image", "thin-image-tight-budget"],
)
def test_dynamic_grids_are_usable(target, sizes, budget):
    grids = target.processor_counts().dynamic_grids(sizes, budget, 16, 1, 64)
    assert len(grids) == len(sizes)
    for cols, rows in grids:
        assert cols >= 2, f"a {cols}-patch-wide grid"
        assert rows >= 2, f"a {rows}-patch-high grid"
        assert cols % 2 == 0, "whole 2 x 2 blocks for the pixel shuffle"
        assert rows % 2 == 0, "whole 2 x 2 blocks for the pixel shuffle"
