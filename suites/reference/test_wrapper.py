"""The reference wrapper's pieces: pixel shuffle, video separators, merge."""

from __future__ import annotations

import pytest
import torch

from reference_impl.connector import pixel_shuffle
from reference_impl.inputs import InputValidationError
from reference_impl.model import merge_multimodal_embeddings
from reference_impl.tokenizer import IMG_CONTEXT, IMG_END, IMG_START, shared_tokenizer
from reference_impl.video_replacement import frame_separators, video_replacement_ids


def test_pixel_shuffle_merges_each_block_into_channels():
    # x[n, y, x, c] = 1000*y + 10*x + c: each output channel names where it came from.
    gh, gw, c = 4, 6, 2
    y, xx, ch = torch.meshgrid(torch.arange(gh), torch.arange(gw), torch.arange(c), indexing="ij")
    x = (1000 * y + 10 * xx + ch).unsqueeze(0).float()
    out = pixel_shuffle(x, 2)
    assert out.shape == (1, 2, 3, 8)
    # Output (i, j), merged channel (dy*r + dx)*C + ch comes from input (2i+dy, 2j+dx, ch).
    for i in range(2):
        for j in range(3):
            for dy in range(2):
                for dx in range(2):
                    for k in range(c):
                        expected = 1000 * (2 * i + dy) + 10 * (2 * j + dx) + k
                        assert out[0, i, j, (dy * 2 + dx) * c + k] == expected


def test_pixel_shuffle_v1_is_transposed_and_warns():
    x = torch.randn(1, 4, 6, 2)
    with pytest.warns(UserWarning, match="transposed"):
        out = pixel_shuffle(x, 2, "v1")
    assert out.shape == (1, 3, 2, 8)


def test_frame_separators_t1():
    assert frame_separators(2, [0, 3], 500) == [
        "Frame 1 sampled at 0.00 seconds: ",
        "\nFrame 2 sampled at 1.50 seconds: ",
    ]


def test_frame_separators_tubelets_list_their_frames():
    assert frame_separators(2, [0, 1, 2], 500, temporal_patch_size=2) == [
        "Frame 1 sampled at 0.00 seconds and frame 2 sampled at 0.50 seconds: ",
        "\nFrame 3 sampled at 1.00 seconds: ",
    ]


def test_frame_separators_without_timestamps():
    assert frame_separators(2, [0, 1], None) == ["Frame 1: ", "\nFrame 2: "]


def test_video_replacement_layout():
    tok = shared_tokenizer()
    ids = video_replacement_ids(tok, [2, 2], [0, 1], 1000)
    text = tok.decode(ids)
    ctx = IMG_CONTEXT * 2
    assert text == (
        f"Frame 1 sampled at 0.00 seconds: {IMG_START}{ctx}{IMG_END}"
        f"\nFrame 2 sampled at 1.00 seconds: {IMG_START}{ctx}{IMG_END}"
    )


def test_merge_overwrites_placeholders_in_order():
    embeds = torch.zeros(5, 2)
    mask = torch.tensor([False, True, True, False, True])
    out = merge_multimodal_embeddings(embeds, [torch.ones(2, 2), 2 * torch.ones(1, 2)], mask)
    assert out[:, 0].tolist() == [0, 1, 1, 0, 2]
    assert embeds.sum() == 0  # input untouched


def test_merge_count_mismatch_names_the_counts():
    with pytest.raises(InputValidationError, match=r"expected 3 rows .* got 2 \+ 2 = 4 rows"):
        merge_multimodal_embeddings(
            torch.zeros(5, 2),
            [torch.ones(2, 2), torch.ones(2, 2)],
            torch.tensor([True, True, True, False, False]),
        )
