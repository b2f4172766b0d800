"""The reference RADIO vision tower: parity with vLLM's RadioModel, packing, video tubelets,
checkpoint loading, and its use as the wrapper's vision tower."""

from __future__ import annotations

import pytest
import torch

from harness.checkpoints.spec import ModelSpec
from harness.inputs import model_kwargs
from reference_impl.config import VLConfig
from reference_impl.errors import ConfigError
from reference_impl.model import NanoNemotronVLModel
from reference_impl.presets import tiny_radio_config
from reference_impl.radio import RADIO_SIZES, RadioConfig, RadioVisionModel
from reference_impl.tokenizer import VOCAB_SIZE, shared_tokenizer
from suites.harness.helpers import needs_vllm

PARITY = RadioConfig.from_model_name(
    "vit_small_patch16_224", num_layers=2, register_multiple=4, video_temporal_patch_size=2
)


def checkpoint(model: RadioVisionModel) -> dict[str, torch.Tensor]:
    """The model's weights under checkpoint names (``vision_model.radio_model.model.*``)."""
    out = {}
    for name, tensor in model.state_dict().items():
        name = name.replace("patch_generator.cls_token", "patch_generator.cls_token.token")
        out[f"vision_model.radio_model.model.{name}"] = tensor.clone()
    return out


@pytest.fixture(scope="module")
def pair():
    """Ours and vLLM's RADIO (vit_small width, 2 layers) with the same random weights, loaded
    into vLLM through its own ``load_weights`` (checkpoint names, ``vision_model.`` stripped as
    vLLM's wrapper does)."""
    from harness.oracles import vllm_layers

    torch.manual_seed(0)
    ours = RadioVisionModel(PARITY).eval()
    weights = {k.removeprefix("vision_model."): v for k, v in checkpoint(ours).items()}
    return ours, vllm_layers.radio(PARITY, weights)


@needs_vllm
@pytest.mark.vllm
class TestParityWithVllm:
    """Tolerance 1e-5 (fp32 on CPU); measured: tiles and video 0 (the same ops in the same
    order), dynamic resolution ~1e-6 (vLLM's varlen attention vs a block-diagonal mask)."""

    def test_tiles(self, pair):
        ours, theirs = pair
        x = torch.randn(2, 3, 64, 48, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            assert (ours.forward_tiles(x) - theirs(x)[1]).abs().max() <= 1e-5

    @pytest.mark.parametrize("frames", [2, 3, 5])
    def test_video_tubelets(self, pair, frames):
        ours, theirs = pair
        x = torch.randn(frames, 3, 32, 48, generator=torch.Generator().manual_seed(frames))
        with torch.no_grad():
            expected = theirs(x, num_frames=frames)[1]
            actual = ours.forward_video(x, 2)
        assert actual.shape[0] == (frames + 1) // 2
        assert (actual - expected).abs().max() <= 1e-5

    def test_dynamic_resolution(self, pair):
        ours, theirs = pair
        gen = torch.Generator().manual_seed(2)
        images = [torch.randn(3, 32, 48, generator=gen), torch.randn(3, 64, 32, generator=gen)]
        sizes = [(32, 48), (64, 32)]
        packed = torch.cat(
            [torch.nn.functional.unfold(i[None], 16, stride=16)[0].T for i in images]
        )[None]  # [1, patches, 3*16*16], (c yy xx) order
        with torch.no_grad():
            expected = theirs(packed, imgs_sizes=sizes)[1][0]
            actual = torch.cat(ours.forward_dynamic(images))
        assert (actual - expected).abs().max() <= 1e-5


def test_packed_images_equal_separate_images():
    """The block-diagonal mask keeps images apart: packed == one at a time."""
    torch.manual_seed(0)
    model = RadioVisionModel(tiny_radio_config(register_multiple=4)).eval()
    gen = torch.Generator().manual_seed(3)
    images = [torch.randn(3, 16, 24, generator=gen), torch.randn(3, 32, 8, generator=gen)]
    with torch.no_grad():
        packed = model.forward_dynamic(images)
        alone = [model.forward_tiles(i[None])[0] for i in images]
    for p, a in zip(packed, alone, strict=True):
        assert p.shape == a.shape
        assert (p - a).abs().max() <= 1e-5


def test_video_pads_by_repeating_the_last_frame():
    torch.manual_seed(0)
    model = RadioVisionModel(tiny_radio_config(video_temporal_patch_size=2)).eval()
    frames = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        padded = model.forward_video(torch.cat([frames, frames[-1:]]), 2)
        assert torch.equal(model.forward_video(frames, 2), padded)


def test_size_table_and_errors():
    assert RADIO_SIZES["vit_huge_patch16_224"] == (1280, 32, 16, 5120)
    assert RadioConfig.from_model_name("vit_so400m_patch16_224").hidden_size == 1152
    with pytest.raises(ConfigError, match=r"vision_config\.args\.model"):
        RadioConfig.from_model_name("vit_giant")
    with pytest.raises(ConfigError, match="num_heads"):
        tiny_radio_config(num_heads=5)
    model = RadioVisionModel(tiny_radio_config())
    with pytest.raises(ConfigError, match=r"multiples of patch_size=8"):
        model.forward_tiles(torch.zeros(1, 3, 20, 16))
    with pytest.raises(ConfigError, match=r"a \[n, 3, H, W\] tensor"):
        model.forward_tiles(torch.zeros(1, 1, 16, 16))


def test_checkpoint_loading_skips_unused_and_names_problems():
    torch.manual_seed(0)
    source = RadioVisionModel(tiny_radio_config())
    weights = checkpoint(source)
    weights["vision_model.radio_model.summary_idxs"] = torch.tensor([0])
    weights["vision_model.radio_model.input_conditioner.norm_mean"] = torch.zeros(3)
    weights["vision_model.radio_model.model.blocks.0.ls1"] = torch.ones(32)
    target = RadioVisionModel(tiny_radio_config())
    target.load_checkpoint(weights)
    for (name, a), b in zip(source.state_dict().items(), target.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    del weights["vision_model.radio_model.model.blocks.1.mlp.fc1.weight"]
    weights["vision_model.radio_model.model.blocks.9.norm1.weight"] = torch.ones(32)
    with pytest.raises(ConfigError, match=r"missing \['blocks.1.mlp.fc1.weight'\].*blocks.9"):
        RadioVisionModel(tiny_radio_config()).load_checkpoint(weights)


@pytest.mark.parametrize("temporal", [1, 2])
def test_radio_as_the_wrappers_vision_tower(temporal):
    """The wrapper with the real tower: every image and video gives its placeholder rows."""
    spec = ModelSpec(image_size=32, video_temporal_patch_size=temporal, audio=False)
    torch.manual_seed(0)
    tower = RadioVisionModel(tiny_radio_config(video_temporal_patch_size=temporal)).eval()
    model = NanoNemotronVLModel(
        VLConfig(
            hidden_size=spec.hidden_size,
            vocab_size=VOCAB_SIZE,
            vit_hidden_size=32,
            projector_hidden_size=16,
            force_image_size=32,
            patch_size=8,
            video_temporal_patch_size=temporal,
        ),
        vision_model=tower,
        embed_tokens=torch.nn.Embedding(VOCAB_SIZE, spec.hidden_size),
        tokenizer=shared_tokenizer(),
    ).eval()
    images = model_kwargs.image_pixels(spec, [1, 3])
    videos = model_kwargs.video_pixels(spec, [3])
    with torch.no_grad():
        out = model.embed_multimodal(**model_kwargs.combine([images, videos]))
    assert [o.shape[0] for o in out[:2]] == [1 * 4, 3 * 4]  # 4 rows per 32 px tile
    groups = -(-3 // temporal)
    sep_and_tags = out[2].shape[0] - groups * 4
    assert sep_and_tags > 0  # separator text and <img> / </img> rows around the frames
