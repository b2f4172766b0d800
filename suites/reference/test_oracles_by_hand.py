"""The reference's counting and small-tensor paths against values computed by hand from the
published architecture brief (``shared/design/architecture.md``), not from vLLM's code and not
from running the reference: each expected value is written out, with the brief's formula and the
steps that give it, so a reader can redo the arithmetic.

Python's ``round`` rounds halves to even, and the brief's formulas are Python: ``round(31.5)`` is
32 and ``round(32.5)`` is 32.
"""

from __future__ import annotations

import pytest
import torch

from reference_impl import presets, tiling
from reference_impl.audio import AudioConfig, ParakeetAudioTower, audio_token_count
from reference_impl.config import VLConfig
from reference_impl.connector import build_mlp1, pixel_shuffle
from reference_impl.processor import NanoNemotronVLProcessor
from reference_impl.radio import PatchGenerator, RadioVisionModel
from reference_impl.tokenizer import VOCAB_SIZE, shared_tokenizer

STATIC = presets.tiny_vl_config(presets.nemotron_nano_12b_v2_vl(), VOCAB_SIZE)
OMNI = presets.tiny_vl_config(presets.nemotron_3_nano_omni(), VOCAB_SIZE)

# ---------------------------------------------------------------------------------------------
# Static tiling (brief 3.1): the (cols, rows) grid closest to w/h among 1 <= cols*rows <= max,
# by area; on an equal difference the later grid wins if w*h > 0.5 * S^2 * cols * rows; a
# thumbnail after a grid of more than one tile.

#: (w, h, max tiles) -> ((cols, rows), tiles with the thumbnail), S = 512.
STATIC_TILES = [
    # w/h = 1: (1, 1) exact; (2, 2) ties, 512*512 = 262144 > 0.5*512^2*4 = 524288 is false.
    ((512, 512, 12), ((1, 1), 1)),
    # w/h = 2: (2, 1) exact; (4, 2) ties, 524288 > 1048576 false. 2 tiles + thumbnail.
    ((1024, 512, 12), ((2, 1), 3)),
    # w/h = 1: (2, 2) ties (1048576 > 524288); (3, 3) ties, 1048576 > 1179648 false.
    ((1024, 1024, 12), ((2, 2), 5)),
    # w/h = 1: (2, 2) and (3, 3) win their ties (4194304 > 1179648); (4, 4) is over 12 tiles.
    ((2048, 2048, 12), ((3, 3), 10)),
    # w/h = 1.333: (1, 1) differs by 0.333, (2, 2) ties it (480000 > 524288 false); (3, 2)
    # differs by 0.167, the least of the grids up to 6 tiles.
    ((800, 600, 6), ((3, 2), 7)),
    # w/h = 0.3: (1, 3) differs by 0.033; (2, 6) ties (300000 > 1572864 false).
    ((300, 1000, 12), ((1, 3), 4)),
]


@pytest.mark.parametrize(("image", "expected"), STATIC_TILES)
def test_static_tiling_by_hand(
    image: tuple[int, int, int], expected: tuple[tuple[int, int], int]
) -> None:
    w, h, max_tiles = image
    grid, tiles = expected
    assert tiling.closest_grid(w, h, 512, max_tiles) == grid
    assert tiling.num_static_tiles(w, h, 512, max_tiles, True) == tiles
    assert tiling.num_static_tiles(w, h, 512, max_tiles, False) == grid[0] * grid[1]


#: The tiny 12B v2 preset: S = 32, P = 8, 4 tiles at most, thumbnail; (32/8)^2 / 4 = 4 context
#: tokens per tile. (h, w, max_num_tiles) -> context tokens.
STATIC_PROMPTS = [
    ((32, 96, None), 16),  # w/h = 3: (3, 1) exact, 3 tiles + thumbnail = 4 tiles
    ((64, 64, None), 20),  # (2, 2) wins the tie: 4096 > 0.5*32^2*4 = 2048; 4 + thumbnail
    ((64, 64, 1), 4),  # at most 1 tile: (1, 1), no thumbnail
]


@pytest.mark.parametrize(("image", "tokens"), STATIC_PROMPTS)
def test_static_image_prompt_by_hand(image: tuple[int, int, int | None], tokens: int) -> None:
    h, w, max_tiles = image
    pixels = torch.zeros(h, w, 3, dtype=torch.uint8)
    out = NanoNemotronVLProcessor(STATIC, shared_tokenizer())(
        "A <image> B", images=[pixels], max_num_tiles=max_tiles
    )
    assert shared_tokenizer().decode(out.input_ids) == f"A <img>{'<image>' * tokens}</img> B"


# ---------------------------------------------------------------------------------------------
# Dynamic resolution (brief 3.2): grid round(h/P + 0.5) x round(w/P + 0.5); scaled by
# min(sqrt(budget / patches), 1), each side floored; raised to min_num_patches (each side times
# sqrt(min / patches), rounded up); each side made even: up if that still fits the budget, else
# down (at least 2).

#: (w, h, budget, min patches) -> (cols, rows), P = 16.
DYNAMIC_GRIDS = [
    # 32 x 32 patches (round(32.5) = 32), factor 1, even.
    ((512, 512, 1024, 4), (32, 32)),
    # 31 x 31 patches round up to 32 x 32 (round(31.5) = 32).
    ((496, 496, 4096, 4), (32, 32)),
    # rows round(31.75) = 32, cols round(63.0) = 63; factor sqrt(1024/2016) = 0.7127:
    # floor(22.81) = 22 rows, floor(44.90) = 44 cols; both even.
    ((1000, 500, 1024, 4), (44, 22)),
    # rows round(3.0) = 3, cols round(6.75) = 7: 21 < 64; x sqrt(64/21) = 1.746: ceil(5.24) = 6
    # rows, ceil(12.22) = 13 cols; 13 odd: 6 * 14 = 84 <= 1024, so 14.
    ((100, 40, 1024, 64), (14, 6)),
    # rows round(7.0) = 7, cols round(6.0) = 6; factor sqrt(30/42) = 0.845: 5 x 5; rows odd:
    # 6 * 5 = 30 <= 30, so 6; cols odd: 6 * 6 = 36 > 30, so down to 4.
    ((88, 104, 30, 4), (4, 6)),
]


@pytest.mark.parametrize(("image", "grid"), DYNAMIC_GRIDS)
def test_dynamic_grid_by_hand(image: tuple[int, int, int, int], grid: tuple[int, int]) -> None:
    w, h, budget, min_patches = image
    assert tiling.dynamic_grid(w, h, budget, 16, min_patches) == grid


def test_dynamic_image_prompt_by_hand() -> None:
    """The tiny Omni preset: P = 8, at most 64 patches an image. A 70 x 40 image: rows
    round(5.5) = 6, cols round(9.25) = 9; 54 <= 64, factor 1; cols odd: 6 * 10 = 60 <= 64, so
    10; 60 patches / 4 = 15 context tokens; the image resized to 80 x 48."""
    pixels = torch.zeros(40, 70, 3, dtype=torch.uint8)
    out = NanoNemotronVLProcessor(OMNI, shared_tokenizer())("<image>", images=[pixels])
    assert shared_tokenizer().decode(out.input_ids) == f"<img>{'<image>' * 15}</img>"
    assert out.mm_kwargs["imgs_sizes"] == [(48, 80)]


# ---------------------------------------------------------------------------------------------
# Video frames (brief 2, 3.3): S x S without a patch target; with one, a square of
# int(sqrt(target)) patches rounded down to even, or an aspect-preserving grid of
# round(sqrt(target / aspect)) x round(sqrt(target * aspect)) patches, each side made even (up if
# the product still fits the target, else down); (h/P * 0.5) * (w/P * 0.5) tokens a frame.

#: (w, h, patch target, keep aspect) -> (width, height, tokens), S = 512, P = 16.
VIDEO_FRAMES = [
    ((1920, 1080, None, False), (512, 512, 256)),  # S x S: 16 * 16 tokens
    ((1920, 1080, 1024, False), (512, 512, 256)),  # sqrt(1024) = 32 patches a side
    ((1920, 1080, 1000, False), (480, 480, 225)),  # int(31.6) = 31, down to 30; 15 * 15
    # aspect 1.778: round(sqrt(576)) = 24 rows, round(42.67) = 43 cols; up: 24 * 44 = 1056 >
    # 1024, so down: 24 x 42 patches, 12 * 21 tokens.
    ((1920, 1080, 1024, True), (672, 384, 252)),
    # aspect 1.778: round(sqrt(594)) = 24 rows, round(43.33) = 43 cols; up: 24 * 44 = 1056 fits
    # the target exactly, so 24 x 44 patches, 12 * 22 tokens.
    ((1920, 1080, 1056, True), (704, 384, 264)),
    # aspect 1.333: round(13.86) = 14 rows, round(18.48) = 18 cols; even, 252 <= 256.
    ((640, 480, 256, True), (288, 224, 63)),
]


@pytest.mark.parametrize(("frame", "expected"), VIDEO_FRAMES)
def test_video_frame_size_by_hand(
    frame: tuple[int, int, int | None, bool], expected: tuple[int, int, int]
) -> None:
    w, h, target, keep_aspect = frame
    assert tiling.video_frame_size(w, h, 512, 16, 0.5, target, keep_aspect) == expected


# ---------------------------------------------------------------------------------------------
# Audio tokens (brief 2): 30 s clips (a remainder at least 0.1 s); clip_samples // hop frames;
# log2(factor) times L = floor((L + add_pad) / stride + 1), add_pad = ((k-1)//2)*2 - k; summed,
# at least 1. Kernel 3, stride 2: add_pad = -1 and each step is ceil(L / 2), so ceil(L / 8).

#: samples -> tokens, the checkpoints' defaults (factor 8, kernel 3, stride 2, hop 160).
AUDIO_TOKENS = [
    (1, 2),  # padded to 1600 samples: 10 frames, ceil(10/8) = 2
    (16000, 13),  # 100 frames: ceil(12.5) = 13
    (32000, 25),  # 200 frames: 25
    (30 * 16000, 375),  # 3000 frames: 375
    (30 * 16000 + 10, 377),  # 375 + a 0.1 s clip's 2
    (61 * 16000 + 5, 763),  # 375 + 375 + 16005 samples' 100 frames: 13
]


@pytest.mark.parametrize(("samples", "tokens"), AUDIO_TOKENS)
def test_audio_tokens_by_hand(samples: int, tokens: int) -> None:
    assert audio_token_count(samples, AudioConfig(llm_hidden_size=8)) == tokens


def test_audio_tokens_with_another_kernel_by_hand() -> None:
    """Factor 4, kernel 4: add_pad = (3//2)*2 - 4 = -2, each step floor(L / 2); 1 s: 100
    frames, 50, 25."""
    config = AudioConfig(llm_hidden_size=8, subsampling_factor=4, subsampling_conv_kernel_size=4)
    assert audio_token_count(16000, config) == 25


def test_audio_prompt_by_hand() -> None:
    """One second in the tiny Omni preset (the checkpoints' subsampling): 13 tokens."""
    out = NanoNemotronVLProcessor(OMNI, shared_tokenizer())(
        "<so_embedding>", audios=[torch.zeros(16000)]
    )
    expected = f"<so_start>{'<so_embedding>' * 13}<so_end>"
    assert shared_tokenizer().decode(out.input_ids) == expected


# ---------------------------------------------------------------------------------------------
# RADIO (brief 5.3): class and register tokens; the CPE position embedding

#: (class tokens, register_multiple) -> (registers, skip tokens):
#: registers = register_multiple - (class tokens % register_multiple), none without a multiple.
REGISTERS = [
    ((1, None), (0, 1)),
    ((1, 4), (3, 4)),
    ((1, 8), (7, 8)),
    ((2, 4), (2, 4)),
    ((4, 4), (4, 8)),  # 4 % 4 = 0: a whole multiple of registers, not none
    ((3, 8), (5, 8)),
]


@pytest.mark.parametrize(("tokens", "expected"), REGISTERS)
def test_registers_by_hand(tokens: tuple[int, int | None], expected: tuple[int, int]) -> None:
    """The token parameter holds class tokens and registers; the features drop them all."""
    cls_tokens, multiple = tokens
    registers, skip = expected
    config = presets.tiny_radio_config(register_multiple=multiple, num_cls_tokens=cls_tokens)
    assert (config.num_registers, config.num_skip) == (registers, skip)
    model = RadioVisionModel(config).eval()
    assert model.patch_generator.cls_token.shape == (skip, 32)
    with torch.no_grad():
        assert model.patch_generator(torch.zeros(1, 3, 16, 24)).shape == (1, skip + 6, 32)
        assert model.forward_tiles(torch.zeros(1, 3, 16, 24)).shape == (1, 6, 32)


def generator_with_table(cpe_max_size: int, image_size: int) -> PatchGenerator:
    """A 2-wide patch generator (8 px patches) whose position table holds ``4r + c`` in channel 0
    and 10 in channel 1 at grid row ``r``, column ``c`` (row-major)."""
    config = presets.tiny_radio_config(
        hidden_size=2, num_heads=1, mlp_size=4, cpe_max_size=cpe_max_size, image_size=image_size
    )
    generator = PatchGenerator(config)
    g = config.pos_grid
    rows, cols = torch.meshgrid(torch.arange(g), torch.arange(g), indexing="ij")
    table = torch.stack([4.0 * rows + cols, torch.full((g, g), 10.0)], dim=-1)
    with torch.no_grad():
        generator.pos_embed.copy_(table.reshape(1, g * g, 2))
    return generator


#: Bilinear resizing (align_corners=False) of a length-2 axis: output i samples the input at
#: (i + 0.5) * 2 / n - 0.5, clamped to [0, 1]: for n = 4, 0, 0.25, 0.75, 1; for n = 3, 0, 0.5, 1.
UP4 = [0.0, 0.25, 0.75, 1.0]
UP3 = [0.0, 0.5, 1.0]


@pytest.mark.parametrize(
    ("grid", "expected"),
    [
        # CPE (a 2 x 2 table for 16 px, image_size 32 px): resized to max(h, w) square, then the
        # top-left h x w. Channel 0 of the table is 4r + c: 4 * s_r + s_c after resizing.
        ((4, 3), [[4 * r + c for c in UP4[:3]] for r in UP4]),
        ((1, 3), [[4 * UP3[0] + c for c in UP3]]),
        ((2, 2), [[0.0, 1.0], [4.0, 5.0]]),  # the table's own grid: as it is
    ],
)
def test_cpe_position_embedding_by_hand(grid: tuple[int, int], expected: list[list[float]]) -> None:
    gh, gw = grid
    table = generator_with_table(cpe_max_size=16, image_size=32).position_embedding(gh, gw)
    assert table.shape == (gh * gw, 2)
    torch.testing.assert_close(table[:, 0], torch.tensor(expected).flatten())
    torch.testing.assert_close(table[:, 1], torch.full((gh * gw,), 10.0))


def test_position_embedding_without_cpe_is_cropped_by_hand() -> None:
    """Not CPE (``image_size`` = ``cpe_max_size``: a 4 x 4 table): the top-left h x w of the
    table, no resizing; past the table, the crop (all of it) is resized."""
    cropped = generator_with_table(cpe_max_size=32, image_size=32).position_embedding(2, 3)
    assert cropped[:, 0].tolist() == [0.0, 1.0, 2.0, 4.0, 5.0, 6.0]
    small = generator_with_table(cpe_max_size=16, image_size=16)  # a 2 x 2 table, not CPE
    grown = small.position_embedding(4, 4)  # 4 * s_r + s_c on a 4-wide axis both ways
    expected = torch.tensor([[4 * r + c for c in UP4] for r in UP4]).flatten()
    torch.testing.assert_close(grown[:, 0], expected)


# ---------------------------------------------------------------------------------------------
# Projectors (brief 4): RMSNorm -> Linear -> ReLU^2 -> Linear


def test_pixel_shuffle_v1_is_v2_transposed_by_hand() -> None:
    """Brief 5.1: with ``"v1"`` the output comes out as ``(n, w/r, h/r, ...)``, i.e. transposed;
    v2's element order is checked by hand in ``test_wrapper.py``."""
    x = torch.arange(2 * 4 * 6 * 3, dtype=torch.float32).reshape(2, 4, 6, 3)
    with pytest.warns(UserWarning, match="transposed"):
        v1 = pixel_shuffle(x, 2, "v1")
    assert v1.shape == (2, 3, 2, 12)
    assert torch.equal(v1, pixel_shuffle(x, 2).transpose(1, 2))


def test_mlp1_by_hand() -> None:
    """x = [2, -2, 2, -2]: rms 2, normalised [1, -1, 1, -1] (eps 1e-5 changes it by ~1e-6);
    W1 rows [1, 0, 1, 0], [-1, 0, 0, 0], [0.5, 0.5, 0.5, 0.5]: [2, -1, 0]; ReLU^2: [4, 0, 0];
    W2 rows [1, 1, 1], [0.5, 0, 3]: [4, 2]."""
    config = VLConfig(
        hidden_size=2,
        vocab_size=VOCAB_SIZE,
        vit_hidden_size=1,
        projector_hidden_size=3,
        force_image_size=32,
        patch_size=8,
    )
    mlp1 = build_mlp1(config)
    mlp1.load_state_dict(
        {
            "0.weight": torch.ones(4),
            "1.weight": torch.tensor([[1.0, 0, 1, 0], [-1, 0, 0, 0], [0.5, 0.5, 0.5, 0.5]]),
            "3.weight": torch.tensor([[1.0, 1, 1], [0.5, 0, 3]]),
        }
    )
    with torch.no_grad():
        out = mlp1(torch.tensor([[2.0, -2.0, 2.0, -2.0]]))
    torch.testing.assert_close(out, torch.tensor([[4.0, 2.0]]), rtol=1e-4, atol=0)


def test_sound_projection_with_biases_by_hand() -> None:
    """``projection_bias``: both linears carry a bias. Hidden [3, 4, 0, 0] (rms 2.5), norm weight
    2: [2.4, 3.2, 0, 0]; W1 rows [1, 0, 0, 0], [0, -1, 0, 0] + bias [0.6, 0]: [3, -3.2]; ReLU^2:
    [9, 0]; W2 row [1, 1] + bias 1: 10."""
    config = AudioConfig(
        llm_hidden_size=1,
        hidden_size=4,
        projection_hidden_size=2,
        projection_bias=True,
        num_mel_bins=16,
        num_hidden_layers=1,
        num_attention_heads=1,
        intermediate_size=8,
        subsampling_conv_channels=4,
    )
    projection = ParakeetAudioTower(config).projection
    projection.load_state_dict(
        {
            "0.weight": torch.full((4,), 2.0),
            "1.weight": torch.tensor([[1.0, 0, 0, 0], [0, -1, 0, 0]]),
            "1.bias": torch.tensor([0.6, 0.0]),
            "3.weight": torch.tensor([[1.0, 1.0]]),
            "3.bias": torch.tensor([1.0]),
        }
    )
    with torch.no_grad():
        out = projection(torch.tensor([[3.0, 4.0, 0.0, 0.0]]))
    torch.testing.assert_close(out, torch.tensor([[10.0]]), rtol=1e-4, atol=0)


# ---------------------------------------------------------------------------------------------
# Registration (brief, header and 11)


def test_registered_architectures_are_the_briefs() -> None:
    """Three names map to the class (brief, "Registered architectures"); vLLM 0.33.0 adds a
    fourth (brief 11)."""
    assert set(presets.ARCHITECTURES) == {
        "NemotronH_Nano_VL_V2",
        "NemotronH_Nano_Omni_Reasoning_V3",
        "NemotronH_Super_Omni_Reasoning_V3",
        "NemotronH_Omni_Reasoning_V3",
    }
