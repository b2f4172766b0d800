"""Processor arithmetic on every target: the counts that size the prompt's placeholders.

Static tile counts and audio token counts must equal the reference's (the reference's own tests
show they equal vLLM's functions over hypothesis draws); the dynamic-resolution tiler must give
every image a usable patch grid, thin images included (no division by zero, no 0-patch side).
"""

from __future__ import annotations

import pytest

from reference_impl import processor
from reference_impl.audio import AudioConfig, audio_token_count

pytestmark = pytest.mark.concern("processor")

SIZES = [(1, 1), (16, 3000), (700, 300), (512, 512), (1024, 520), (3000, 40), (333, 777)]


@pytest.mark.parametrize(("width", "height"), SIZES)
@pytest.mark.parametrize("max_tiles", [1, 6, 12])
def test_static_tile_counts(target, width, height, max_tiles):
    counts = target.processor_counts()
    assert counts.static_tiles(width, height, 512, max_tiles, True) == (
        processor.num_static_tiles(width, height, 512, max_tiles, True)
    )


@pytest.mark.parametrize("samples", [1, 1600, 16000, 480000, 480001, 16000 * 61 + 5])
def test_audio_token_counts(target, samples):
    config = AudioConfig(llm_hidden_size=8, num_mel_bins=128)
    assert target.processor_counts().audio_tokens(samples) == audio_token_count(samples, config)


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
