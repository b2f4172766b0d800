"""The reference processor: tiling, frame sizes and separators against vLLM's own functions,
prompt expansion, metadata from the config alone, and bad input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_impl import metadata, presets, processor, tiling, video_replacement
from reference_impl.errors import ConfigError
from reference_impl.processor import NanoNemotronVLProcessor, Video
from reference_impl.tokenizer import VOCAB_SIZE, shared_tokenizer
from suites.harness.helpers import needs_vllm

STATIC = presets.tiny_vl_config(presets.nemotron_nano_12b_v2_vl(), VOCAB_SIZE)
OMNI = presets.tiny_vl_config(presets.nemotron_3_nano_omni(), VOCAB_SIZE)


def image(h, w, seed=0):
    return torch.randint(
        0, 256, (h, w, 3), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8
    )


@pytest.fixture(scope="module")
def vllm_processors():
    from harness.oracles.vllm_layers import init_cpu_runtime

    init_cpu_runtime()
    from vllm.transformers_utils.processors import internvl, nano_nemotron_vl

    return internvl, nano_nemotron_vl


@needs_vllm
@pytest.mark.vllm
class TestParityWithVllm:
    """Token counting and separator text against vLLM's processor functions (exact)."""

    @settings(max_examples=200, deadline=None)
    @given(
        w=st.integers(1, 4000),
        h=st.integers(1, 4000),
        tiles=st.integers(1, 12),
        thumb=st.booleans(),
    )
    def test_static_tiles(self, vllm_processors, w, h, tiles, thumb):
        internvl, _ = vllm_processors
        blocks, width, height = internvl.calculate_internvl_targets(
            orig_width=w,
            orig_height=h,
            target_ratios=internvl.get_internvl_target_ratios(1, tiles),
            image_size=512,
            use_thumbnail=thumb,
        )
        cols, rows = tiling.closest_grid(w, h, 512, tiles)
        assert (width, height) == (512 * cols, 512 * rows)
        assert blocks == tiling.num_static_tiles(w, h, 512, tiles, thumb)

    @settings(max_examples=150, deadline=None)
    @given(
        sizes=st.lists(
            st.tuples(st.integers(16, 1500), st.integers(16, 1500)), min_size=1, max_size=4
        ),
        available=st.integers(16, 3000),
        min_patches=st.sampled_from([1, 4, 16]),
        max_patches=st.sampled_from([0, 64, 1024]),
    )
    def test_dynamic_grids(self, vllm_processors, sizes, available, min_patches, max_patches):
        from PIL import Image

        _, nnvl = vllm_processors
        tiler = nnvl.DynamicResolutionImageTiler(
            max_model_len=8192,
            patch_size=16,
            min_num_patches=min_patches,
            max_num_patches=max_patches,
            downsample_ratio=0.5,
            norm_mean=[0.5] * 3,
            norm_std=[0.5] * 3,
        )
        images = [Image.new("L", size) for size in sizes]
        try:
            theirs = [p.patch_size for p in tiler.compute_params(images, available)]
        except ZeroDivisionError:
            theirs = None
        ours = tiling.dynamic_grids(sizes, available, 16, min_patches, max_patches)
        if theirs is None or any(0 in grid for grid in theirs):
            # vLLM 0.33.0: an image whose short side floors to 0 patches either divides by
            # zero or comes out with a 0-patch side; the reference keeps at least 2 patches.
            assert all(cols >= 2 and rows >= 2 for cols, rows in ours)
            return
        assert ours == theirs

    def test_thin_image_crashes_vllm_not_the_reference(self, vllm_processors):
        from PIL import Image

        _, nnvl = vllm_processors
        tiler = nnvl.DynamicResolutionImageTiler(
            max_model_len=8192,
            patch_size=16,
            min_num_patches=1,
            max_num_patches=64,
            downsample_ratio=0.5,
            norm_mean=[0.5] * 3,
            norm_std=[0.5] * 3,
        )
        with pytest.raises(ZeroDivisionError):
            tiler.compute_params([Image.new("L", (1470, 5))], 2768)
        cols, rows = tiling.dynamic_grids([(1470, 5)], 2768, 16, 1, 64)[0]
        assert cols >= 2
        assert rows >= 2

    @settings(max_examples=200, deadline=None)
    @given(
        w=st.integers(1, 4000),
        h=st.integers(1, 4000),
        target=st.integers(1, 4096),
        keep_aspect=st.booleans(),
    )
    def test_video_frame_size(self, vllm_processors, w, h, target, keep_aspect):
        _, nnvl = vllm_processors
        theirs = nnvl.get_video_target_size_and_feature_size(
            orig_w=w,
            orig_h=h,
            target_patches=target,
            maintain_aspect_ratio=keep_aspect,
            patch_size=16,
            downsample_ratio=0.5,
        )
        assert tiling.video_frame_size(w, h, 512, 16, 0.5, target, keep_aspect) == theirs

    @pytest.mark.parametrize(
        ("frames", "temporal", "duration"), [(3, 1, 500), (5, 2, 250), (4, 2, 1000), (2, 1, None)]
    )
    def test_video_replacement_ids(self, frames, temporal, duration):
        from harness.targets.vllm.requests import video_replacement_ids

        tok = shared_tokenizer()
        groups = -(-frames // temporal)
        indices = list(range(0, 2 * frames, 2))
        theirs = video_replacement_ids(tok, [4] * groups, indices, duration, temporal)
        ours = video_replacement.video_replacement_ids(
            tok, [4] * groups, indices, duration, temporal
        )
        assert ours == theirs

    def test_tile_pixels(self, vllm_processors):
        """The tiles' pixel values (bicubic, antialias, normalisation): tolerance 1e-5."""
        from PIL import Image

        _, nnvl = vllm_processors
        pixels = image(300, 700)
        theirs = nnvl.dynamic_preprocess(
            Image.fromarray(pixels.numpy()),
            image_size=64,
            max_num_tiles=6,
            use_thumbnail=True,
            norm_mean=torch.tensor(STATIC.norm_mean).reshape(1, 3, 1, 1),
            norm_std=torch.tensor(STATIC.norm_std).reshape(1, 3, 1, 1),
        )
        ours = tiling.tile_image(
            pixels.permute(2, 0, 1), 64, 6, True, STATIC.norm_mean, STATIC.norm_std
        )
        assert ours.shape == theirs.shape
        assert (ours - theirs).abs().max() <= 1e-5


def test_metadata_from_config_alone(monkeypatch):
    """Metadata questions never build a processor or touch a tokenizer."""
    monkeypatch.setattr(
        processor.NanoNemotronVLProcessor,
        "__init__",
        lambda *a, **k: (_ for _ in ()).throw(AssertionError("built")),
    )
    assert metadata.supports_video(STATIC)
    assert not metadata.supports_audio(STATIC)
    assert metadata.supports_audio(OMNI)
    assert not metadata.is_dynamic_tiler(STATIC)
    assert metadata.is_dynamic_tiler(OMNI)


def test_prompt_expansion_static():
    proc = NanoNemotronVLProcessor(STATIC, shared_tokenizer())
    out = proc("A <image> B", images=[image(32, 96)])
    tok = shared_tokenizer()
    text = tok.decode(out.input_ids)
    tiles = tiling.num_static_tiles(96, 32, 32, STATIC.max_num_tiles, True)
    assert text == f"A <img>{'<image>' * tiles * 4}</img> B"
    assert sum(out.is_multimodal) == tiles * 4 == out.placeholders[0].length
    assert out.mm_kwargs["image_num_patches"].tolist() == [tiles]


def test_prompt_expansion_video_marks_the_whole_replacement():
    proc = NanoNemotronVLProcessor(STATIC, shared_tokenizer())
    frames = torch.zeros(2, 32, 32, 3, dtype=torch.uint8)
    out = proc("<video>!", videos=[Video(frames, fps=4.0)])
    span = out.placeholders[0]
    assert span.start == 0
    assert all(out.is_multimodal[: span.length])
    assert not out.is_multimodal[span.length]
    assert "Frame 2 sampled at 0.25 seconds: " in shared_tokenizer().decode(out.input_ids)


def test_prompt_expansion_audio():
    proc = NanoNemotronVLProcessor(OMNI, shared_tokenizer())
    out = proc("hear <so_embedding>", audios=[torch.zeros(16000)])
    from reference_impl.audio import audio_token_count

    n = audio_token_count(16000, OMNI.sound_config)
    assert shared_tokenizer().decode(out.input_ids) == (
        f"hear <so_start>{'<so_embedding>' * n}<so_end>"
    )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"text": "<image>", "images": [torch.zeros(0, 10, 3, dtype=torch.uint8)]}, "images[0]"),
        ({"text": "<image>", "images": [torch.zeros(10, 10, 4, dtype=torch.uint8)]}, "images[0]"),
        ({"text": "<image> <image>", "images": [image(8, 8)]}, "images"),
        ({"text": "<image>", "images": [image(8, 8)], "max_num_tiles": 99}, "max_num_tiles"),
        (
            {"text": "<video>", "videos": [Video(torch.zeros(0, 8, 8, 3, dtype=torch.uint8))]},
            "videos[0].frames",
        ),
        (
            {
                "text": "<video>",
                "videos": [Video(torch.zeros(2, 8, 8, 3, dtype=torch.uint8), frames_indices=[0])],
            },
            "videos[0].frames_indices",
        ),
        ({"text": "<so_embedding>", "audios": [torch.zeros(10)]}, "audios"),
    ],
)
def test_bad_input_names_the_input(kwargs, field):
    proc = NanoNemotronVLProcessor(STATIC, shared_tokenizer())
    with pytest.raises(ConfigError) as info:
        proc(**kwargs)
    assert str(info.value).startswith(f"config field '{field}'")


@pytest.mark.parametrize("audio", [torch.zeros(0), torch.tensor([1.0, float("nan")])])
def test_bad_audio_names_the_input(audio):
    proc = NanoNemotronVLProcessor(OMNI, shared_tokenizer())
    with pytest.raises(ConfigError, match=r"audios\[0\]"):
        proc("<so_embedding>", audios=[audio])


class TestPrecomputedEmbeddings:
    """Embeddings in place of media: an image's ``f`` rows fill ``<img>`` + ``f`` context tokens
    + ``</img>``, a video's fill ``f`` context tokens; the embeddings are the model's input."""

    def setup_method(self):
        self.tokenizer = shared_tokenizer()
        self.proc = NanoNemotronVLProcessor(STATIC, self.tokenizer)

    def ids(self, text):
        return self.tokenizer.encode(text, add_special_tokens=False)

    def test_image_embeddings_fill_the_image_placeholders(self):
        rows = torch.randn(3, STATIC.hidden_size)
        out = self.proc("a<image>b", image_embeds=[rows])
        expected = self.ids("a") + self.ids("<img>" + "<image>" * 3 + "</img>") + self.ids("b")
        assert out.input_ids == expected
        start = len(self.ids("a<img>"))
        assert [(p.modality, p.start, p.length) for p in out.placeholders] == [("images", start, 3)]
        assert out.mm_kwargs["image_embeds"][0] is rows

    def test_video_embeddings_fill_context_tokens(self):
        rows = torch.randn(4, STATIC.hidden_size)
        out = self.proc("<video>!", video_embeds=[rows])
        assert out.input_ids == self.ids("<image>" * 4 + "!")
        assert out.is_multimodal == [True] * 4 + [False] * len(self.ids("!"))

    def test_both_forms_of_one_modality_are_refused(self):
        with pytest.raises(ConfigError, match="image_embeds"):
            self.proc("<image><image>", images=[image(8, 8)], image_embeds=[torch.randn(2, 64)])

    @pytest.mark.parametrize("shape", [(3, 7), (3,), (1, 3, 64)])
    def test_embeddings_of_the_wrong_shape_are_refused(self, shape):
        with pytest.raises(ConfigError, match=r"image_embeds\[0\]"):
            self.proc("<image>", image_embeds=[torch.randn(shape)])
