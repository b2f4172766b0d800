"""The reference audio path: features, clips and token counts, the Parakeet tower, and the
placeholder count matching the embedding rows."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_impl.audio import (
    AudioConfig,
    ParakeetAudioTower,
    audio_token_count,
    clip_sizes,
    extract_features,
    mel_filter_bank,
)
from reference_impl.config import VLConfig
from reference_impl.errors import ConfigError
from reference_impl.model import NanoNemotronVLModel
from reference_impl.tokenizer import VOCAB_SIZE, shared_tokenizer
from suites.harness.helpers import needs_vllm

TINY = AudioConfig(
    llm_hidden_size=32,
    num_mel_bins=16,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    subsampling_conv_channels=8,
    projection_hidden_size=48,
    conv_kernel_size=5,
)
SECOND = 16000


def waves(*lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=gen) * 0.1 for n in lengths]


def test_mel_filter_bank_matches_transformers():
    """Tolerance 1e-6; measured 0."""
    from transformers.audio_utils import mel_filter_bank as hf_mel_filter_bank

    expected = hf_mel_filter_bank(
        num_frequency_bins=257,
        num_mel_filters=128,
        min_frequency=0.0,
        max_frequency=8000,
        sampling_rate=16000,
        norm="slaney",
        mel_scale="slaney",
    )
    actual = mel_filter_bank(257, 128, 16000)
    assert (actual - torch.from_numpy(expected.T).float()).abs().max() <= 1e-6


def test_clip_sizes():
    assert clip_sizes(30 * SECOND, TINY) == [30 * SECOND]
    assert clip_sizes(61 * SECOND, TINY) == [30 * SECOND, 30 * SECOND, SECOND]
    assert clip_sizes(30 * SECOND + 10, TINY) == [30 * SECOND, 1600]  # tail padded to 0.1 s
    assert clip_sizes(5, TINY) == [1600]


def test_features_shape_and_mask():
    features, mask, clips = extract_features(waves(2 * SECOND, 31 * SECOND), TINY)
    assert clips == [1, 2]
    assert features.shape == (3, mask.shape[1], 16)
    assert mask.sum(1).tolist() == [200, 3000, 100]
    assert features[~mask].abs().max() == 0  # padding frames are zero


@pytest.mark.parametrize(
    ("audio", "message"),
    [
        (torch.zeros(0), "0 samples"),
        (torch.tensor([0.0, float("nan")]), "NaN or infinite"),
        (torch.zeros(2, 2, 2), r"\[samples\] or \[samples, channels\]"),
    ],
)
def test_bad_audio_names_the_item(audio, message):
    with pytest.raises(ConfigError, match=message) as info:
        extract_features([torch.zeros(100), audio], TINY)
    assert "audios[1]" in str(info.value)


def test_stereo_is_averaged():
    mono = waves(SECOND)[0]
    stereo = torch.stack([mono, mono], dim=-1)
    assert torch.equal(extract_features([stereo], TINY)[0], extract_features([mono], TINY)[0])


@pytest.fixture(scope="module")
def towers():
    """Ours and vLLM's ProjectedParakeet with the same random weights (checkpoint names)."""
    from harness.oracles import vllm_layers

    torch.manual_seed(0)
    ours = ParakeetAudioTower(TINY).eval()
    weights = {}
    for name, tensor in ours.state_dict().items():
        if name.startswith("encoder."):
            name = "sound_encoder." + name
        else:
            for index, part in (("0", "norm"), ("1", "linear1"), ("3", "linear2")):
                name = name.replace(f"projection.{index}.", f"sound_projection.{part}.")
        weights[name] = tensor.clone()
    return ours, vllm_layers.parakeet(TINY, weights)


@needs_vllm
@pytest.mark.vllm
class TestParityWithVllm:
    def test_features_match_vllms_extractor(self):
        """vLLM's ParakeetExtractor (torch.stft, its own mel filters): tolerance 1e-5,
        measured ~2e-6."""
        from transformers import PretrainedConfig

        from harness.oracles.vllm_layers import init_cpu_runtime

        init_cpu_runtime()
        from vllm.model_executor.models.parakeet import ParakeetExtractor

        config = AudioConfig(llm_hidden_size=32, num_mel_bins=80)
        extractor = ParakeetExtractor(
            PretrainedConfig(
                num_mel_bins=80,
                sampling_rate=16000,
                subsampling_factor=8,
                subsampling_conv_kernel_size=3,
                subsampling_conv_stride=2,
            )
        )
        audio = waves(2 * SECOND, 5000, 31 * SECOND)
        theirs = extractor([a.numpy() for a in audio])
        features, mask, clips = extract_features(audio, config)
        assert clips == theirs["audio_num_clips"]
        assert torch.equal(mask, theirs["feature_attention_mask"])
        assert (features - theirs["input_audio_features"]).abs().max() <= 1e-5
        for n in (1, 100, 1599, 1600, SECOND, 30 * SECOND, 30 * SECOND + 1, 61 * SECOND + 5):
            assert extractor.audio_token_count(n) == audio_token_count(n, config), n

    def test_tower_matches_projected_parakeet(self, towers):
        """transformers' encoder configured as vLLM does, then the projection: tolerance 1e-5
        in fp32 (vLLM's forward casts to bf16 before its projection; compared here in fp32
        step by step), measured 0."""
        ours, theirs = towers
        features, mask, _ = extract_features(waves(SECOND, 7000, seed=1), TINY)
        with torch.no_grad():
            hidden = theirs.encoder(input_features=features, attention_mask=mask)
            expected = theirs.projection(hidden.last_hidden_state)
            actual = ours(features, mask)
        assert (actual - expected).abs().max() <= 1e-5
        lengths = mask.sum(1)
        assert ours.output_lengths(lengths).tolist() == (
            theirs.encoder._get_subsampling_output_length(lengths).tolist()
        )


@settings(max_examples=15, deadline=None)
@given(lengths=st.lists(st.integers(1, 3 * SECOND), min_size=1, max_size=3))
def test_placeholders_equal_embedding_rows(lengths):
    """For any audio lengths, the prompt's ``<so_embedding>`` count for each audio equals the
    rows the model produces for it."""
    tower = _wrapper_tower()
    model = _wrapper(tower)
    features, mask, clips = extract_features(waves(*lengths), TINY)
    with torch.no_grad():
        out = model.embed_multimodal(
            input_audio_features=features, feature_attention_mask=mask, audio_num_clips=clips
        )
    assert [o.shape[0] for o in out] == [audio_token_count(n, TINY) for n in lengths]


_CACHE: dict[str, object] = {}


def _wrapper_tower() -> ParakeetAudioTower:
    if "tower" not in _CACHE:
        torch.manual_seed(0)
        _CACHE["tower"] = ParakeetAudioTower(TINY).eval()
    return _CACHE["tower"]  # type: ignore[return-value]


def _wrapper(tower: ParakeetAudioTower) -> NanoNemotronVLModel:
    return NanoNemotronVLModel(
        VLConfig(
            hidden_size=32,
            vocab_size=VOCAB_SIZE,
            vit_hidden_size=8,
            projector_hidden_size=16,
            force_image_size=32,
            patch_size=8,
            has_audio=True,
        ),
        vision_model=None,  # type: ignore[arg-type]
        embed_tokens=torch.nn.Embedding(VOCAB_SIZE, 32),
        tokenizer=shared_tokenizer(),
        sound_encoder=tower,
    ).eval()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"hidden_act": "swishy"}, r"'hidden_act': expected one of \[.*'silu'"),
        ({"subsampling_conv_stride": 0}, r"'subsampling_conv_stride': expected a positive int"),
        # 16 bins, kernel 5, stride 3 twice: the convolutions leave 2 bins, transformers'
        # encoder sizes its linear layer for 16 // 9 = 1.
        (
            {
                "subsampling_factor": 4,
                "subsampling_conv_kernel_size": 5,
                "subsampling_conv_stride": 3,
            },
            r"'subsampling_conv_stride': expected a stride whose 2 convolutions .* 2 left, 1 "
            r"expected\), got 3",
        ),
    ],
)
def test_an_encoder_transformers_cannot_build_is_refused_naming_the_field(changes, message):
    import dataclasses

    with pytest.raises(ConfigError, match=message):
        dataclasses.replace(TINY, **changes)


def test_the_encoder_takes_the_checkpoint_s_activation():
    """sound_config.hidden_act reaches transformers' encoder: its feed-forwards and convolution
    modules compute with it (both published checkpoints: silu)."""
    import dataclasses

    torch.manual_seed(0)
    silu = ParakeetAudioTower(TINY).eval()
    gelu = ParakeetAudioTower(dataclasses.replace(TINY, hidden_act="gelu")).eval()
    gelu.load_state_dict(silu.state_dict())
    features, mask, _ = extract_features(waves(SECOND), TINY)
    with torch.no_grad():
        a, b = silu(features, mask), gelu(features, mask)
    assert a.shape == b.shape
    assert (a - b).abs().max() > 1e-4, "the activation changed no row"
    activations = {type(m).__name__ for m in gelu.encoder.modules()}
    assert "GELUActivation" in activations, activations
    assert "SiLUActivation" not in activations, activations
