"""The reference's audio path against transformers' own implementations, not vLLM's: until these,
vLLM's functions were the only oracle of this path, so parity caught vLLM drifting from itself but
not a bug it already had.

The oracles, all in transformers 5.20:

- ``models/parakeet``: the Parakeet feature extractor (its mel filterbank taken from
  ``transformers.audio_utils``: its own comes from librosa, which this environment lacks; the two
  agree to 1e-6, ``test_audio.py``) and the encoder's subsampled lengths;
- ``models/nemotron_h_omni``: NVIDIA's port of the Omni checkpoint's remote code: the audio
  encoder's settings, projector (``embed_audio``) and feature path, and the processor's audio
  token count.

Where transformers' port and the reference (with vLLM) differ by design, the test pins the
difference rather than hiding it: the audio rows (one mel frame, see
:func:`test_audio_rows_are_transformers_but_for_one_mel_frame`).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from reference_impl.audio import (
    AudioConfig,
    ParakeetAudioTower,
    audio_token_count,
    extract_features,
)

# Skips this module where transformers has no Omni port or torchvision is absent.
from suites.reference.transformers_twins import OMNI, Twins, omni_processor, twins


@pytest.fixture(scope="module")
def omni() -> Twins:
    return twins(OMNI)


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
