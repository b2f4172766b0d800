"""The reference's vision, processor and audio paths against transformers' own implementations,
not vLLM's: until these, vLLM's functions were the only oracle of these paths, so parity caught vLLM
drifting from itself but not a bug it already had.

The oracles, all in transformers 5.20:

- ``models/radio``: RADIO (C-RADIO) with its CPE position embedding, class and register tokens,
  packed images and temporally packed video patches;
- ``models/nemotron_h_omni``: NVIDIA's port of the Omni checkpoint's remote code: the model's
  ``pixel_shuffle``, projectors (``multi_modal_projector``, ``embed_audio``), the image, video and
  audio feature paths and EVS; the checkpoint's image processor (dynamic resolution), video
  processor (frame size and pixels) and the processor's placeholder text;
- ``models/got_ocr2``: the InternVL-style static tiling (closest grid, tiles, thumbnail last);
- ``models/parakeet``: the Parakeet feature extractor (its mel filterbank taken from
  ``transformers.audio_utils``: its own comes from librosa, which this environment lacks; the two
  agree to 1e-6, ``test_audio.py``).

A transformers twin of a reference model is built from the reference's config and loaded with the
reference's weights (perturbed first so that every norm and bias matters); tolerances are fp32
rounding (measured on CPU, noted per test).

Where transformers' port and the reference (with vLLM) differ by design, the test pins the
difference rather than hiding it: the audio rows (one mel frame, see
:func:`test_audio_rows_are_transformers_but_for_one_mel_frame`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_impl import evs, presets, tiling
from reference_impl.audio import (
    AudioConfig,
    ParakeetAudioTower,
    audio_token_count,
    extract_features,
)
from reference_impl.config import VLConfig
from reference_impl.connector import Connector, pixel_shuffle
from reference_impl.model import NanoNemotronVLForConditionalGeneration
from reference_impl.processor import NanoNemotronVLProcessor, Video
from reference_impl.radio import RadioConfig, RadioVisionModel, patchify
from reference_impl.tokenizer import (
    AUDIO_CONTEXT,
    IMG_CONTEXT,
    VOCAB_SIZE,
    shared_tokenizer,
)
from reference_impl.video_replacement import video_replacement_ids

omni_modeling = pytest.importorskip(
    "transformers.models.nemotron_h_omni.modeling_nemotron_h_omni",
    reason="transformers before 5.20 has no port of the Omni checkpoint",
)
pytest.importorskip("torchvision", reason="transformers' image processors resize with torchvision")
from transformers.models.got_ocr2.image_processing_got_ocr2 import (  # noqa: E402
    GotOcr2ImageProcessor,
    get_optimal_tiled_canvas,
)
from transformers.models.nemotron_h_omni.configuration_nemotron_h_omni import (  # noqa: E402
    NemotronH_Omni_Reasoning_V3_Config,
)
from transformers.models.nemotron_h_omni.image_processing_nemotron_h_omni import (  # noqa: E402
    NemotronH_Omni_Reasoning_V3ImageProcessor,
    get_patch_grid_size,
)
from transformers.models.nemotron_h_omni.processing_nemotron_h_omni import (  # noqa: E402
    NemotronH_Omni_Reasoning_V3Processor,
)
from transformers.models.nemotron_h_omni.video_processing_nemotron_h_omni import (  # noqa: E402
    NemotronH_Omni_Reasoning_V3VideoProcessor,
)
from transformers.models.radio.configuration_radio import (  # noqa: E402
    RadioConfig as HFRadioConfig,
)
from transformers.models.radio.modeling_radio import RadioModel as HFRadioModel  # noqa: E402

MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)
#: The tiny Omni preset, with frames resized towards a patch target keeping their aspect (the
#: checkpoint's video processor has no S x S mode).
OMNI = dataclasses.replace(
    presets.tiny_vl_config(presets.nemotron_3_nano_omni(), VOCAB_SIZE),
    video_target_num_patches=24,
    video_maintain_aspect_ratio=True,
)
STATIC = presets.tiny_vl_config(presets.nemotron_nano_12b_v2_vl(), VOCAB_SIZE)


def pixels(h: int, w: int, seed: int) -> torch.Tensor:
    """An ``[h, w, 3]`` uint8 image of noise."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (h, w, 3), generator=generator, dtype=torch.uint8)


# ---------------------------------------------------------------------------------------------
# Twins: transformers' modules with the reference's weights


def hf_radio_config(config: RadioConfig, num_registers: int, temporal: int | None) -> Any:
    """transformers' RADIO config for the reference's tower shape, with the register count
    given by the caller (so a test can state it by hand)."""
    hf = HFRadioConfig(
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        mlp_ratio=config.mlp_size / config.hidden_size,
        patch_size=config.patch_size,
        image_size=config.image_size,
        max_img_size=config.cpe_max_size,
        num_cls_tokens=config.num_cls_tokens,
        num_registers=num_registers,
        video_temporal_patch_size=temporal,
        summary_idxs=[0],
        layer_norm_eps=config.layer_norm_eps,
    )
    hf._attn_implementation = "eager"
    return hf


def radio_weights(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The reference RADIO's weights under transformers' names: the fused ``qkv`` split in
    three (query, key, value: the checkpoint's order), ``proj`` as ``o_proj``."""
    out = {
        f"{prefix}embeddings.patch_projection.weight": state["patch_generator.embedder.weight"],
        f"{prefix}embeddings.position_embedding": state["patch_generator.pos_embed"],
        f"{prefix}embeddings.cls_register_token": state["patch_generator.cls_token"],
    }
    if "patch_generator.video_embedder.weight" in state:
        out[f"{prefix}embeddings.video_patch_projection.weight"] = state[
            "patch_generator.video_embedder.weight"
        ]
    layer = 0
    while f"blocks.{layer}.norm1.weight" in state:
        ours, theirs = f"blocks.{layer}.", f"{prefix}encoder.layer.{layer}."
        for a, b in (
            ("norm1", "norm1"),
            ("norm2", "norm2"),
            ("mlp.fc1", "mlp.fc1"),
            ("mlp.fc2", "mlp.fc2"),
            ("attn.proj", "attention.o_proj"),
        ):
            out[f"{theirs}{b}.weight"] = state[f"{ours}{a}.weight"]
            out[f"{theirs}{b}.bias"] = state[f"{ours}{a}.bias"]
        weights = state[f"{ours}attn.qkv.weight"].chunk(3)
        biases = state[f"{ours}attn.qkv.bias"].chunk(3)
        for name, weight, bias in zip("qkv", weights, biases, strict=True):
            out[f"{theirs}attention.{name}_proj.weight"] = weight
            out[f"{theirs}attention.{name}_proj.bias"] = bias
        layer += 1
    return out


def projector_weights(sequential: torch.nn.Module, prefix: str) -> dict[str, torch.Tensor]:
    """``RMSNorm, Linear, ReLU^2, Linear`` (indices 0, 1, 3) under transformers' projector
    names."""
    names = {"0": "layer_norm", "1": "linear_1", "3": "linear_2"}
    return {
        f"{prefix}{names[key.split('.')[0]]}.{key.split('.', 1)[1]}": tensor
        for key, tensor in sequential.state_dict().items()
    }


def perturb(module: torch.nn.Module, seed: int) -> None:
    """Every parameter moved by N(0, 0.1²): norm weights away from 1, biases away from 0."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))


def load(hf: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Load ``weights`` into ``hf``; transformers' own layer scales (ones), ``summary_idxs``, the
    language model and a video projection the reference lacks (T = 1; all unused here) are all
    it may keep."""
    missing, unexpected = hf.load_state_dict(weights, strict=False)
    assert not unexpected, unexpected
    unused = ("layer_scale", "summary_idxs", "video_patch_projection")
    kept = [
        m
        for m in missing
        if not m.startswith("language_model.") and not any(u in m for u in unused)
    ]
    assert not kept, f"transformers' twin kept its own random {kept}"


@dataclasses.dataclass
class Twins:
    """A reference model and transformers' Omni model carrying its weights."""

    ours: NanoNemotronVLForConditionalGeneration
    theirs: Any  # transformers' NemotronH_Omni_Reasoning_V3


def twins(config: VLConfig, seed: int = 0) -> Twins:
    """The reference model for ``config`` and transformers' Omni model built from the same
    sizes, carrying the reference's (perturbed) vision, connector and audio weights."""
    tokenizer = shared_tokenizer()
    torch.manual_seed(seed)
    ours = NanoNemotronVLForConditionalGeneration(config, tokenizer).eval()
    mm: Any = ours.multimodal
    perturb(mm.vision_model, seed + 1)
    perturb(mm.connector, seed + 2)
    if mm.sound_encoder is not None:
        perturb(mm.sound_encoder.projection, seed + 3)
    vision = config.vision_config
    text = config.text_config
    assert vision is not None
    assert text is not None
    text_fields = text.to_transformers_dict()
    if text.num_nextn_predict_layers:
        text_fields["mtp_layers_block_type"] = ["attention"] * text.num_nextn_predict_layers
    vision_fields = hf_radio_config(vision, vision.num_registers, 2)
    # transformers' port reads one epsilon for RADIO's blocks and the MTP vision norm.
    assert vision.layer_norm_eps == vision.final_layernorm_eps
    sound = config.sound_config
    hf_config = NemotronH_Omni_Reasoning_V3_Config(
        vision_config=vision_fields,
        text_config=text_fields,
        # Without attention_bias / scale_input: the port supplies the checkpoint's values.
        audio_config=None
        if sound is None
        else {
            **sound.encoder_fields(),
            "projection_hidden_size": sound.projection_hidden_size,
            "projection_bias": sound.projection_bias,
        },
        downsample_ratio=config.downsample_ratio,
        projector_hidden_size=config.projector_hidden_size,
        vision_hidden_size=config.vit_hidden_size,
        video_temporal_patch_size=2,
        image_token_id=tokenizer.convert_tokens_to_ids(IMG_CONTEXT),
        audio_token_id=tokenizer.convert_tokens_to_ids(AUDIO_CONTEXT),
    )
    hf_config._attn_implementation = "eager"
    hf_config.vision_config._attn_implementation = "eager"
    theirs = omni_modeling.NemotronH_Omni_Reasoning_V3(hf_config).eval()
    weights = radio_weights(mm.vision_model.state_dict(), "vision_model.")
    weights |= projector_weights(mm.connector.mlp1, "multi_modal_projector.")
    if mm.connector.vision_final_layernorm is not None:
        for key, tensor in mm.connector.vision_final_layernorm.state_dict().items():
            weights[f"vision_final_layernorm.{key}"] = tensor
    if mm.sound_encoder is not None:
        encoder = mm.sound_encoder.encoder.state_dict()
        weights |= {f"audio_tower.{k}": t for k, t in encoder.items()}
        weights |= projector_weights(mm.sound_encoder.projection, "embed_audio.")
    load(theirs, weights)
    return Twins(ours, theirs)


@pytest.fixture(scope="module")
def omni() -> Twins:
    return twins(OMNI)


@pytest.fixture(scope="module")
def static() -> Twins:
    return twins(STATIC)


def max_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """The largest elementwise difference of two equally shaped lists of tensors."""
    assert [tuple(x.shape) for x in a] == [tuple(y.shape) for y in b]
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


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
# Whole image, video and audio paths against transformers' Omni model and processors


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


def omni_processor(image_processor: Any = None) -> Any:
    """transformers' Omni processor holding only what its placeholder text methods read (the
    whole processor needs the checkpoint's tokenizer and feature extractor)."""
    processor = object.__new__(NemotronH_Omni_Reasoning_V3Processor)
    processor.image_start_token, processor.image_end_token = "<img>", "</img>"
    processor.image_token = IMG_CONTEXT
    processor.image_processor = image_processor
    processor.video_temporal_patch_dim = 2
    processor.audio_hop_length = 160
    processor.audio_subsampling_factor = 8
    return processor


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


# ---------------------------------------------------------------------------------------------
# Audio against transformers' Parakeet extractor and the Omni model


def parakeet_extractor(config: AudioConfig) -> Any:
    """transformers' ``ParakeetFeatureExtractor`` for ``config``, its mel filters from
    ``transformers.audio_utils`` (its constructor asks librosa for them)."""
    from transformers.audio_utils import mel_filter_bank
    from transformers.feature_extraction_sequence_utils import SequenceFeatureExtractor
    from transformers.models.parakeet.feature_extraction_parakeet import (
        ParakeetFeatureExtractor,
    )

    extractor = object.__new__(ParakeetFeatureExtractor)
    SequenceFeatureExtractor.__init__(
        extractor,
        feature_size=config.num_mel_bins,
        sampling_rate=config.sampling_rate,
        padding_value=config.padding_value,
    )
    extractor.hop_length, extractor.n_fft = config.hop_length, config.n_fft
    extractor.win_length, extractor.preemphasis = config.win_length, config.preemphasis
    filters = mel_filter_bank(
        num_frequency_bins=config.n_fft // 2 + 1,
        num_mel_filters=config.num_mel_bins,
        min_frequency=0.0,
        max_frequency=config.sampling_rate / 2,
        sampling_rate=config.sampling_rate,
        norm="slaney",
        mel_scale="slaney",
    )
    extractor.mel_filters = torch.from_numpy(filters.T).float()
    return extractor


def waves(*lengths: int, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=generator) * 0.1 for n in lengths]


@pytest.mark.parametrize("mel_bins", [16, 128])
def test_features_are_transformers_parakeet_extractor(mel_bins: int) -> None:
    """Clips of up to 30 s (transformers' extractor cuts no clips): pre-emphasis within the
    valid length, the STFT, log-mel, per-clip normalisation over the valid frames, the mask.
    Tolerance 1e-4 (measured ~3e-6: the STFT's float32 sums)."""
    config = AudioConfig(llm_hidden_size=8, num_mel_bins=mel_bins)
    audio = waves(32000, 7000, 1600, 30 * 16000)
    features, mask, clips = extract_features(audio, config)
    theirs = parakeet_extractor(config)([a.numpy() for a in audio], sampling_rate=16000)
    assert clips == [1, 1, 1, 1]
    assert torch.equal(mask, theirs["attention_mask"])
    assert (features - theirs["input_features"]).abs().max() <= 1e-4


def test_the_encoder_is_built_as_the_checkpoint_asks(omni: Twins) -> None:
    """transformers' Omni config supplies the released checkpoints' encoder settings (no
    attention bias, no input scaling) where ``ParakeetEncoderConfig`` defaults to True: the
    reference's encoder has the same."""
    theirs = omni.theirs.config.audio_config
    ours: Any = omni.ours.multimodal.sound_encoder
    assert (theirs.attention_bias, theirs.scale_input) == (False, False)
    assert (ours.encoder.config.attention_bias, ours.encoder.config.scale_input) == (False, False)


@pytest.mark.parametrize(("factor", "kernel"), [(8, 3), (4, 5), (4, 4), (2, 3)])
def test_output_lengths_are_transformers_encoders(factor: int, kernel: int) -> None:
    """Encoder frames per clip from its valid feature frames (log2(factor) strided
    convolutions): transformers' ``ParakeetEncoder._get_subsampling_output_length``."""
    config = AudioConfig(
        llm_hidden_size=8,
        num_mel_bins=16,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=1,
        intermediate_size=8,
        subsampling_conv_channels=4,
        projection_hidden_size=8,
        subsampling_factor=factor,
        subsampling_conv_kernel_size=kernel,
    )
    tower = ParakeetAudioTower(config)
    lengths = torch.arange(1, 3001, 7)
    expected = tower.encoder._get_subsampling_output_length(lengths)
    assert tower.output_lengths(lengths).tolist() == expected.tolist()


def test_audio_rows_are_transformers_but_for_one_mel_frame(omni: Twins) -> None:
    """The audio tower's rows (encoder, projection, each clip cut to its valid length) against
    transformers' ``get_audio_features``: every row the reference keeps is transformers' row
    (tolerance 1e-5, measured ~1e-6).

    A documented difference, not hidden: transformers' port (and NVIDIA's remote processor it
    was ported from) counts ``1 + L // hop`` mel frames per clip (``mask.sum() + 1``, and
    ``_estimate_audio_num_embeddings``), vLLM and the reference ``L // hop`` (the extractor's
    valid frames). After the 8x subsampling (``ceil(n / 8)`` for kernel 3, stride 2) they differ
    by one row whenever ``L // 160`` is a multiple of 8: a 2 s clip (200 frames) gives 25 rows
    here and in vLLM, 26 in transformers."""
    sound = OMNI.sound_config
    assert sound is not None
    audio = waves(32000, 7000, 3 * 16000 + 77, seed=1)
    features, mask, clips = extract_features(audio, sound)
    with torch.no_grad():
        actual = omni.ours.multimodal.embed_by_modality(
            input_audio_features=features, feature_attention_mask=mask, audio_num_clips=clips
        )["audios"][1]
        expected = omni.theirs.get_audio_features(features, mask).pooler_output
    frames = [len(a) // 160 for a in audio]
    ours_rows = [math.ceil(f / 8) for f in frames]  # by hand: 25, 6, 38
    theirs_rows = [math.ceil((f + 1) / 8) for f in frames]  # by hand: 26, 6, 38
    assert [a.shape[0] for a in actual] == ours_rows == [25, 6, 38]
    assert theirs_rows == [26, 6, 38]
    assert expected.shape[0] == sum(theirs_rows)
    for clip, (a, start) in enumerate(zip(actual, [0, 26, 32], strict=True)):
        b = expected[start : start + a.shape[0]]
        assert (a - b).abs().max() <= 1e-5, clip
    processor = omni_processor()
    assert [processor._estimate_audio_num_embeddings(len(a)) for a in audio] == theirs_rows
    assert [audio_token_count(len(a), sound) for a in audio] == ours_rows
