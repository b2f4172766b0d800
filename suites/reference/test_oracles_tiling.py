"""The reference's tiling, image and frame sizes and EVS against transformers' own
implementations, not vLLM's: until these, vLLM's functions were the only oracle of these paths, so
parity caught vLLM drifting from itself but not a bug it already had.

The oracles, all in transformers 5.20:

- ``models/got_ocr2``: the InternVL-style static tiling (closest grid, tiles, thumbnail last);
- ``models/nemotron_h_omni``: NVIDIA's port of the Omni checkpoint's remote code: the
  checkpoint's image processor (dynamic resolution: ``get_patch_grid_size``), video processor
  (frame size) and EVS (``compute_retention_mask``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_impl import evs, tiling

# Skips this module where transformers has no Omni port or torchvision is absent.
from suites.reference.transformers_twins import MEAN, STD, omni_modeling, pixels

# After the helper, whose guards must run first.
# isort: split
from transformers.models.got_ocr2.image_processing_got_ocr2 import (
    GotOcr2ImageProcessor,
    get_optimal_tiled_canvas,
)
from transformers.models.nemotron_h_omni.image_processing_nemotron_h_omni import (
    NemotronH_Omni_Reasoning_V3ImageProcessor,
    get_patch_grid_size,
)
from transformers.models.nemotron_h_omni.video_processing_nemotron_h_omni import (
    NemotronH_Omni_Reasoning_V3VideoProcessor,
)

# ---------------------------------------------------------------------------------------------
# Static tiling against GOT-OCR2's (InternVL's) tiler


@settings(max_examples=200, deadline=None)
@given(w=st.integers(1, 4000), h=st.integers(1, 4000), tiles=st.integers(1, 12))
def test_static_grid_is_internvl_tiling(w: int, h: int, tiles: int) -> None:
    """The closest ``(cols, rows)`` grid, ties to the later grid while the image covers more than
    half of it: transformers' ``get_optimal_tiled_canvas``."""
    expected = get_optimal_tiled_canvas((h, w), (512, 512), 1, tiles)
    assert tiling.closest_grid(w, h, 512, tiles) == expected


@pytest.mark.parametrize(
    ("h", "w", "max_tiles"), [(300, 700, 6), (700, 300, 6), (64, 64, 4), (100, 250, 12)]
)
def test_tiles_are_internvl_tiles(h: int, w: int, max_tiles: int) -> None:
    """The tiles' pixels: resized (bicubic, antialiased, in float) to the grid, cut row-major,
    the thumbnail last when there is more than one tile, rescaled and normalised: transformers'
    GOT-OCR2 processor given the same float image (given uint8, torchvision resizes in uint8 and
    rounds). Tolerance 1e-5 (measured ~2e-7)."""
    image = pixels(h, w, h + w).permute(2, 0, 1).float()
    processor = GotOcr2ImageProcessor(
        crop_to_patches=True,
        size={"height": 64, "width": 64},
        min_patches=1,
        max_patches=max_tiles,
        image_mean=list(MEAN),
        image_std=list(STD),
    )
    expected = processor(image, return_tensors="pt")["pixel_values"]
    actual = tiling.tile_image(image, 64, max_tiles, True, MEAN, STD)
    assert actual.shape == expected.shape
    assert (actual - expected).abs().max() <= 1e-5


# ---------------------------------------------------------------------------------------------
# Dynamic resolution and video frame sizes against the checkpoint's processors


def transformers_grid_or_none(
    w: int, h: int, budget: int, patch: int, min_patches: int
) -> tuple[int, int] | None:
    """``(cols, rows)`` from transformers' ``get_patch_grid_size``, or None where it has no
    answer: a very thin image whose short side floors to 0 patches (it divides by zero or gives
    a 0-patch side, as vLLM 0.33.0 does; the reference keeps 2: ``test_processor.py``)."""
    try:
        rows, cols = get_patch_grid_size(h, w, patch, 2, min_patches, budget)
    except ZeroDivisionError:
        return None
    return None if 0 in (rows, cols) else (cols, rows)


@settings(max_examples=300, deadline=None)
@given(
    w=st.integers(1, 4000),
    h=st.integers(1, 4000),
    budget=st.integers(1, 16384),
    min_patches=st.sampled_from([1, 4, 16, 64, 1024]),
)
def test_dynamic_grid_is_the_checkpoints(w: int, h: int, budget: int, min_patches: int) -> None:
    """One image's patch grid under a patch budget: transformers' ``get_patch_grid_size``."""
    expected = transformers_grid_or_none(w, h, budget, 16, min_patches)
    actual = tiling.dynamic_grid(w, h, budget, 16, min_patches)
    if expected is None:
        assert min(actual) >= 1
        return
    assert actual == expected


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.tuples(st.integers(16, 600), st.integers(16, 600)), min_size=1, max_size=3),
    available=st.integers(16, 3000),
    min_patches=st.sampled_from([1, 4, 16]),
    max_patches=st.sampled_from([0, 64, 1024]),
)
def test_dynamic_grids_are_the_checkpoints_when_no_budget_is_shared(
    sizes: list[tuple[int, int]], available: int, min_patches: int, max_patches: int
) -> None:
    """A request's images under ``available`` tokens: the checkpoint's image processor gives
    every image the same budget; vLLM (and the reference) share the request's budget out only
    when the images' grids overflow it. Where they fit, both are the processor's grids."""
    processor = NemotronH_Omni_Reasoning_V3ImageProcessor(
        patch_size=16,
        min_num_patches=min_patches,
        max_num_patches=max_patches,
        max_model_len=available + 4,
    )
    images = [torch.zeros(3, h, w) for w, h in sizes]
    try:
        grids = processor(images, return_tensors="pt")["image_grid_hw"].tolist()
    except ZeroDivisionError:  # a thin image: see transformers_grid_or_none
        return
    expected = [(cols, rows) for rows, cols in grids]
    if any(0 in grid for grid in expected):
        return
    if sum(c * r for c, r in expected) > max(available * 4, min_patches * len(sizes)):
        return  # over the request's budget: vLLM's sharing rounds, which transformers lacks
    assert tiling.dynamic_grids(sizes, available, 16, min_patches, max_patches) == expected


#: One video processor, its patch target and aspect mode set per example.
_VIDEO_PROCESSOR: Any = NemotronH_Omni_Reasoning_V3VideoProcessor(patch_size=16)


@settings(max_examples=200, deadline=None)
@given(
    w=st.integers(1, 4000),
    h=st.integers(1, 4000),
    target=st.integers(1, 4096),
    keep_aspect=st.booleans(),
)
def test_video_frame_size_is_the_checkpoints(
    w: int, h: int, target: int, keep_aspect: bool
) -> None:
    """Frames resized towards a patch target, aspect kept or square: the checkpoint's video
    processor's ``_compute_target_patches`` and token count (``wp * hp / 4``)."""
    processor = _VIDEO_PROCESSOR
    processor.video_target_num_patches = target
    processor.video_maintain_aspect_ratio = keep_aspect
    wp, hp = processor._compute_target_patches(h, w)
    expected = (wp * 16, hp * 16, wp * hp // 4)
    assert tiling.video_frame_size(w, h, 512, 16, 0.5, target, keep_aspect) == expected


# ---------------------------------------------------------------------------------------------
# EVS against transformers' port


@pytest.mark.parametrize("rate", [0.0, 0.3, 0.5, 0.75, 0.97])
@pytest.mark.parametrize(("groups", "rows", "cols"), [(1, 2, 2), (6, 2, 2), (9, 3, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_evs_keeps_what_transformers_keeps(
    rate: float, groups: int, rows: int, cols: int, dtype: torch.dtype
) -> None:
    """The retention mask (first group whole, the most changed tokens, ties to the earlier) is
    transformers' ``compute_retention_mask``, repeated groups included (exact ties at 0)."""
    k = rows * cols
    generator = torch.Generator().manual_seed(groups * 100 + k)
    embeds = torch.randn(groups, k, 8, generator=generator).to(dtype)
    embeds[2::3] = embeds[1::3][: len(embeds[2::3])]
    expected = omni_modeling.compute_retention_mask(
        video_embeds=embeds.reshape(groups * k, 8),
        thw=(groups, rows, cols),
        spatial_merge_size=1,
        q=rate,
    )
    assert torch.equal(evs.retention_mask(embeds, rate).flatten(), expected)
