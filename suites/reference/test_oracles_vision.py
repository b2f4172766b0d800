"""The reference's vision path against transformers' own implementations, not vLLM's: until these,
vLLM's functions were the only oracle of this path, so parity caught vLLM drifting from itself but
not a bug it already had.

The oracles, all in transformers 5.20:

- ``models/radio``: RADIO (C-RADIO) with its CPE position embedding, class and register tokens,
  packed images and temporally packed video patches;
- ``models/nemotron_h_omni``: NVIDIA's port of the Omni checkpoint's remote code: the model's
  ``pixel_shuffle``, projector (``multi_modal_projector``) and vision final LayerNorm, the image
  and video feature paths; the checkpoint's image processor (dynamic resolution), video processor
  (frame size and pixels) and the processor's placeholder text.

The twins (transformers' modules with the reference's weights) are built in
``transformers_twins.py``; tolerances are fp32 rounding (measured on CPU, noted per test).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch

from reference_impl import presets
from reference_impl.connector import Connector, pixel_shuffle
from reference_impl.processor import NanoNemotronVLProcessor, Video
from reference_impl.radio import RadioConfig, RadioVisionModel, patchify
from reference_impl.tokenizer import IMG_CONTEXT, shared_tokenizer
from reference_impl.video_replacement import video_replacement_ids

# Skips this module where transformers has no Omni port or torchvision is absent.
from suites.reference.transformers_twins import (
    OMNI,
    STATIC,
    Twins,
    hf_radio_config,
    max_difference,
    omni_processor,
    perturb,
    pixels,
    radio_weights,
    twins,
)

# After the helper, whose guards must run first.
# isort: split
from transformers.models.nemotron_h_omni.image_processing_nemotron_h_omni import (
    NemotronH_Omni_Reasoning_V3ImageProcessor,
)
from transformers.models.nemotron_h_omni.video_processing_nemotron_h_omni import (
    NemotronH_Omni_Reasoning_V3VideoProcessor,
)
from transformers.models.radio.modeling_radio import RadioModel as HFRadioModel


@pytest.fixture(scope="module")
def omni() -> Twins:
    return twins(OMNI)


@pytest.fixture(scope="module")
def static() -> Twins:
    return twins(STATIC)


# ---------------------------------------------------------------------------------------------
# RADIO against transformers' RADIO


def radio_pair(
    config: RadioConfig, num_registers: int, temporal: int | None
) -> tuple[RadioVisionModel, Any]:
    torch.manual_seed(0)
    ours = RadioVisionModel(config).eval()
    perturb(ours, 1)
    theirs = HFRadioModel(hf_radio_config(config, num_registers, temporal)).eval()
    theirs.make_preprocessor_external()  # the processor normalises, as in the Omni model
    missing, unexpected = theirs.load_state_dict(radio_weights(ours.state_dict(), ""), strict=False)
    assert not unexpected
    assert all("layer_scale" in m or m == "summary_idxs" for m in missing), missing
    return ours, theirs


#: (class tokens, register_multiple) -> registers, by hand from the brief:
#: ``register_multiple - (class tokens % register_multiple)``, none without a multiple.
REGISTERS = [((1, None), 0), ((1, 4), 3), ((1, 8), 7), ((2, 4), 2), ((4, 4), 4), ((3, 8), 5)]


@pytest.mark.parametrize(("tokens", "registers"), REGISTERS)
def test_radio_tiles_are_transformers_radio(tokens: tuple[int, int | None], registers: int) -> None:
    """Class and register tokens (the hand-counted registers given to transformers), patch
    embedding, CPE position embedding and the blocks: tiles at several grids, below, at (16 x 16)
    and above the 16 x 16 position table. fp32, tolerance 1e-5 (measured ~1e-6)."""
    cls_tokens, multiple = tokens
    config = presets.tiny_radio_config(register_multiple=multiple, num_cls_tokens=cls_tokens)
    assert config.num_registers == registers
    ours, theirs = radio_pair(config, registers, None)
    for seed, (h, w) in enumerate([(8, 8), (24, 40), (128, 128), (160, 136), (200, 8)]):
        x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            expected = theirs(x).features
            actual = ours.forward_tiles(x)
        assert actual.shape == expected.shape == (2, (h // 8) * (w // 8), 32)
        assert (actual - expected).abs().max() <= 1e-5, (h, w)


@pytest.mark.parametrize("frames", [1, 2, 3, 5])
def test_radio_tubelets_are_transformers_radio(frames: int) -> None:
    """T = 2: the frames padded by repeating the last one, each tubelet's two frames stacked
    along the channels (transformers' packing: ``[F/T, T*3, H, W]``), the video projection.
    Tolerance 1e-5 (measured ~3e-7)."""
    config = presets.tiny_radio_config(register_multiple=4, video_temporal_patch_size=2)
    ours, theirs = radio_pair(config, 3, 2)
    x = torch.randn(frames, 3, 16, 24, generator=torch.Generator().manual_seed(frames))
    padded = torch.cat([x, x[-1:].expand(frames % 2, -1, -1, -1)])
    with torch.no_grad():
        expected = theirs(padded.reshape(-1, 6, 16, 24)).features
        actual = ours.forward_video(x, 2)
    assert actual.shape == expected.shape == (math.ceil(frames / 2), 6, 32)
    assert (actual - expected).abs().max() <= 1e-5


def test_radio_packed_images_are_transformers_radio() -> None:
    """Images of different sizes in one sequence, each attending to itself: transformers' packed
    path (``image_grid_hw``, attention per image). Tolerance 1e-5 (measured ~8e-7)."""
    config = presets.tiny_radio_config(register_multiple=4)
    ours, theirs = radio_pair(config, 3, None)
    generator = torch.Generator().manual_seed(3)
    images = [torch.randn(3, h, w, generator=generator) for h, w in [(16, 24), (32, 8), (8, 8)]]
    packed = torch.cat([patchify(i[None], 8)[0] for i in images])
    grids = torch.tensor([[i.shape[1] // 8, i.shape[2] // 8] for i in images])
    with torch.no_grad():
        expected = theirs(packed, image_grid_hw=grids).features
        actual = torch.cat(ours.forward_dynamic(images))
    assert actual.shape == expected.shape == (6 + 4 + 1, 32)
    assert (actual - expected).abs().max() <= 1e-5


# ---------------------------------------------------------------------------------------------
# The connector against transformers' Omni model


def test_pixel_shuffle_is_transformers(omni: Twins) -> None:
    """transformers' ``pixel_shuffle`` (InternVL's, then transposed: ps_version v2). Exact."""
    x = torch.randn(3, 4, 6, 5)
    assert torch.equal(pixel_shuffle(x, 2), omni.theirs.pixel_shuffle(x, scale_factor=0.5))


def test_mlp1_is_transformers_projector(omni: Twins) -> None:
    """``mlp1`` (RMSNorm, Linear, ReLU^2, Linear; no biases) is transformers'
    ``multi_modal_projector``. fp32, tolerance 1e-5 (measured ~1e-7)."""
    x = torch.randn(2, 7, 4 * OMNI.vit_hidden_size, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = omni.theirs.multi_modal_projector(x)
        actual = omni.ours.multimodal.connector.mlp1(x)
    assert (actual - expected).abs().max() <= 1e-5


def test_vision_final_layernorm_is_transformers() -> None:
    """With MTP layers (``num_nextn_predict_layers > 0``) a LayerNorm with the vision config's
    epsilon normalises the vision features before the pixel shuffle: transformers' port builds and
    places it the same. Tolerance 1e-5."""
    text = OMNI.text_config
    vision = OMNI.vision_config
    assert text is not None
    assert vision is not None
    config = dataclasses.replace(
        OMNI,
        text_config=dataclasses.replace(text, num_nextn_predict_layers=1),
        vision_config=dataclasses.replace(vision, layer_norm_eps=1e-4, final_layernorm_eps=1e-4),
    )
    pair = twins(config, seed=7)
    assert pair.theirs.vision_final_layernorm is not None
    assert pair.theirs.vision_final_layernorm.eps == 1e-4
    connector: Connector = pair.ours.multimodal.connector
    features = torch.randn(
        2, 4 * 6, OMNI.vit_hidden_size, generator=torch.Generator().manual_seed(5)
    )
    with torch.no_grad():
        expected = pair.theirs.project_vision_features(features, 4, 6)
        actual = connector(features, (4, 6))
    assert (actual - expected).abs().max() <= 1e-5


# ---------------------------------------------------------------------------------------------
# Whole image and video paths against transformers' Omni model and processors


def test_static_tiles_embed_as_transformers_radio_then_projector(static: Twins) -> None:
    """The 12B v2 checkpoint's static tiles (and T = 1 frames, which go the same way): each tile
    through RADIO, the pixel shuffle and the projector, as transformers' dense path
    (``vision_model`` then ``project_vision_features``). Tolerance 1e-5 (measured ~5e-7)."""
    proc = NanoNemotronVLProcessor(STATIC, shared_tokenizer())
    out = proc("<image><image>", images=[pixels(40, 90, 0), pixels(32, 32, 1)])
    tiles = out.mm_kwargs["pixel_values_flat"]
    assert isinstance(tiles, torch.Tensor)
    grid = STATIC.force_image_size // STATIC.patch_size
    with torch.no_grad():
        actual = static.ours.multimodal.embed_by_modality(**out.mm_kwargs)["images"][1]
        features = static.theirs.vision_model(tiles).features
        per_tile = static.theirs.project_vision_features(features, grid, grid)
    counts = out.mm_kwargs["image_num_patches"]
    assert isinstance(counts, torch.Tensor)
    expected = [t.reshape(-1, STATIC.hidden_size) for t in per_tile.split(counts.tolist())]
    assert max_difference(actual, expected) <= 1e-5


def test_dynamic_images_are_the_checkpoints_image_processor_and_model(omni: Twins) -> None:
    """Dynamic resolution, three images: the patch grids and pixels are the checkpoint's image
    processor's (one budget of ``max_num_patches`` each, none shared: these fit), the
    placeholder text is its processor's, and the rows are transformers' ``get_image_features``
    (packed RADIO, per-image pixel shuffle, projector). Pixels 1e-5 (measured ~5e-7), rows 1e-5
    (measured ~5e-7)."""
    images = [pixels(40, 70, 0), pixels(64, 32, 1), pixels(200, 90, 2)]
    out = NanoNemotronVLProcessor(OMNI, shared_tokenizer())(
        "<image> <image> <image>", images=images
    )
    image_processor = NemotronH_Omni_Reasoning_V3ImageProcessor(
        image_mean=list(OMNI.norm_mean),
        image_std=list(OMNI.norm_std),
        patch_size=OMNI.patch_size,
        min_num_patches=OMNI.min_num_patches,
        max_num_patches=OMNI.max_num_patches,
        max_model_len=OMNI.max_model_len,
    )
    theirs = image_processor([i.permute(2, 0, 1) for i in images], return_tensors="pt")
    grids = theirs["image_grid_hw"]
    sizes = [(h * OMNI.patch_size, w * OMNI.patch_size) for h, w in grids.tolist()]
    assert out.mm_kwargs["imgs_sizes"] == sizes
    resized = out.mm_kwargs["pixel_values_flat"]
    assert isinstance(resized, list)
    patches = torch.cat([patchify(r[None], OMNI.patch_size)[0] for r in resized])
    assert (patches - theirs["pixel_values"]).abs().max() <= 1e-5
    expected_text = " ".join(
        omni_processor(image_processor).replace_image_token(theirs, i) for i in range(3)
    )
    assert shared_tokenizer().decode(out.input_ids) == expected_text
    with torch.no_grad():
        actual = omni.ours.multimodal.embed_by_modality(**out.mm_kwargs)["images"][1]
        rows = omni.theirs.get_image_features(theirs["pixel_values"], grids).pooler_output
    assert max_difference(actual, list(rows)) <= 1e-5


@pytest.mark.parametrize(("frames", "height", "width"), [(5, 30, 50), (4, 64, 32), (1, 40, 40)])
def test_video_is_the_checkpoints_video_processor_and_model(
    omni: Twins, frames: int, height: int, width: int
) -> None:
    """T = 2 video: the frame size and pixels are the checkpoint's video processor's (patch
    target 24, aspect kept), the replacement text its processor's (stamps from the frame indices
    and fps), and the rows at the ``<image>`` positions transformers' ``get_video_features``
    (tubelets, pixel shuffle, projector). Pixels 1e-5 (measured 0), rows 1e-5 (measured ~2e-7)."""
    from transformers.video_utils import VideoMetadata

    clip = torch.stack([pixels(height, width, seed) for seed in range(frames)])
    indices = [3 * i for i in range(frames)]
    out = NanoNemotronVLProcessor(OMNI, shared_tokenizer())(
        "<video>", videos=[Video(clip, fps=4.0, frames_indices=indices)]
    )
    video_processor = NemotronH_Omni_Reasoning_V3VideoProcessor(
        norm_mean=list(OMNI.norm_mean),
        norm_std=list(OMNI.norm_std),
        patch_size=OMNI.patch_size,
        video_target_num_patches=OMNI.video_target_num_patches,
        video_maintain_aspect_ratio=True,
    )
    theirs = video_processor(
        videos=[clip.permute(0, 3, 1, 2)], return_tensors="pt", do_sample_frames=False
    )
    ours_pixels = out.mm_kwargs["pixel_values_flat_video"]
    assert isinstance(ours_pixels, torch.Tensor)
    assert ours_pixels.shape == theirs["pixel_values_videos"].shape
    assert (ours_pixels - theirs["pixel_values_videos"]).abs().max() <= 1e-5
    metadata = VideoMetadata(total_num_frames=indices[-1] + 1, fps=4.0, frames_indices=indices)
    text = omni_processor().replace_video_token(
        theirs, 0, num_frames=frames, video_metadata=metadata
    )
    assert shared_tokenizer().decode(out.input_ids) == text
    with torch.no_grad():
        rows = omni.ours.multimodal.embed_by_modality(**out.mm_kwargs)["videos"][1][0]
        expected = omni.theirs.get_video_features(theirs["pixel_values_videos"]).pooler_output
    context = torch.tensor(out.input_ids) == shared_tokenizer().convert_tokens_to_ids(IMG_CONTEXT)
    actual = rows[context]
    assert actual.shape == expected.reshape(-1, OMNI.hidden_size).shape
    assert (actual - expected.reshape(-1, OMNI.hidden_size)).abs().max() <= 1e-5


def test_video_replacement_ids_are_the_checkpoint_processors_text() -> None:
    """The ids the model rebuilds for a video (separators, tags, ``k`` context tokens per
    group) decode to the text transformers' port of the checkpoint's processor writes, for T = 1
    and T = 2 and a last tubelet one frame short."""
    from transformers.video_utils import VideoMetadata

    tokenizer = shared_tokenizer()
    for temporal, frames in [(1, 3), (2, 4), (2, 5)]:
        processor = omni_processor()
        processor.video_temporal_patch_dim = temporal
        indices = [0, 5, 10, 15, 20][:frames]
        metadata = VideoMetadata(total_num_frames=21, fps=2.5, frames_indices=indices)
        text = processor.replace_video_token(
            {"num_tokens": [3]}, 0, num_frames=frames, video_metadata=metadata
        )
        groups = math.ceil(frames / temporal)
        ids = video_replacement_ids(tokenizer, [3] * groups, indices, int(1000 / 2.5), temporal)
        assert tokenizer.decode(ids) == text, (temporal, frames)
