"""Images and video frames to tiles or patch grids: how many, of what size, and their pixels.

Glossary: ``S`` tile side (``force_image_size``), ``P`` patch side, ``r`` shuffle factor (2:
one embedding token per ``r x r`` patches), ``t`` tiles of one image, ``H, W`` an image's
height and width; grids are ``(cols, rows)``.

- Static tiling (InternVL style): the ``(cols, rows)`` grid of ``S x S`` tiles closest to the
  image's aspect ratio, a thumbnail after a grid of more than one tile.
- Dynamic resolution: a budget of patches per request shared among its images.
- Video frames: one size for every frame of a request, ``S x S`` or a patch target.

The processor (:mod:`reference_impl.processor`) builds its inputs with these; the counts are
also what a serving engine's processor must agree with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

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
