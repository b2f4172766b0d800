"""Processor arithmetic on every target: the counts that size the prompt's placeholders.

Static tile counts and audio token counts, asked of the target's processor for the default
checkpoint folder (64 px tiles, thumbnail on; hop 160, subsampling 8), must equal the
reference's formulas (the reference's own tests show they equal vLLM's functions over hypothesis
draws); the dynamic-resolution tiler must give
every image a usable patch grid, thin images included (no division by zero, no 0-patch side).
"""

from __future__ import annotations

import pytest

from harness.checkpoint import ModelSpec
from reference_impl import processor
from reference_impl.audio import audio_token_count

pytestmark = pytest.mark.concern("processor")

#: Image sizes around the 64 px tile: square, one tile, just over two, thin and tall, odd.
SIZES = [(1, 1), (2, 375), (88, 38), (64, 64), (128, 65), (375, 5), (42, 97)]
CONFIG = ModelSpec().vl_config()


@pytest.mark.parametrize(("width", "height"), SIZES)
@pytest.mark.parametrize("max_tiles", [1, 6, 12])
def test_static_tile_counts(target, width, height, max_tiles):
    counts = target.processor_counts()
    assert counts.static_tiles(width, height, max_tiles) == (
        processor.num_static_tiles(width, height, CONFIG.force_image_size, max_tiles, True)
    )


@pytest.mark.parametrize("samples", [1, 1600, 16000, 480000, 480001, 16000 * 61 + 5])
def test_audio_token_counts(target, samples):
    assert CONFIG.sound_config is not None
    expected = audio_token_count(samples, CONFIG.sound_config)
    assert target.processor_counts().audio_tokens(samples) == expected


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
