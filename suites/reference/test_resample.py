"""The reference's resampler (``reference_impl/resample.py``) against torchaudio's band-limited
sinc interpolation (the implementation vLLM's media loader calls by default, with the same
parameters), and against the signal itself: a tone below both Nyquist frequencies is the same
tone after resampling."""

from __future__ import annotations

import math

import pytest
import torch

from reference_impl.errors import ConfigError
from reference_impl.resample import resample

RATES = [(44100, 16000), (48000, 16000), (22050, 16000), (8000, 16000), (11025, 16000)]


@pytest.mark.parametrize(("source", "target"), RATES)
@pytest.mark.parametrize("n", [1, 777, 16001])
def test_resampling_is_torchaudio_s(source, target, n):
    torchaudio = pytest.importorskip("torchaudio", reason="torchaudio is the independent oracle")
    samples = 0.1 * torch.randn(n, generator=torch.Generator().manual_seed(n))
    expected = torchaudio.transforms.Resample(source, target)(samples)
    got = resample(samples, source, target)
    assert got.shape == expected.shape == (math.ceil(n * target / source),)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize(("source", "target"), RATES)
def test_a_tone_below_both_nyquists_stays_the_same_tone(source, target):
    """440 Hz for one second: away from the edges (where the clip starts and stops, the kernel
    sees silence), the output is the tone sampled at the target rate."""
    t = torch.arange(source, dtype=torch.float64) / source
    got = resample(torch.sin(2 * math.pi * 440 * t).float(), source, target)
    expected = torch.sin(2 * math.pi * 440 * torch.arange(target, dtype=torch.float64) / target)
    edge = target // 50  # 20 ms
    torch.testing.assert_close(got[edge:-edge].double(), expected[edge:-edge], rtol=0, atol=2e-3)


def test_the_same_rate_is_the_same_samples():
    samples = torch.randn(10)
    assert torch.equal(resample(samples, 16000, 16000), samples)


@pytest.mark.parametrize(
    ("samples", "source", "target", "field"),
    [
        (torch.zeros(4), 0, 16000, "source_rate"),
        (torch.zeros(4), 16000.5, 16000, "source_rate"),
        (torch.zeros(4), 44100, -1, "target_rate"),
        (torch.zeros(2, 4), 44100, 16000, "samples"),
        (torch.zeros(4, dtype=torch.int16), 44100, 16000, "samples"),
        (torch.zeros(4), 16001, 16000, "source_rate"),
    ],
)
def test_bad_input_is_refused_naming_the_field(samples, source, target, field):
    with pytest.raises(ConfigError, match=f"'{field}'"):
        resample(samples, source, target)


def test_a_clip_at_another_rate_reaches_the_reference_s_processor_resampled():
    """The reference target's loader step: an AudioClip at 44.1 kHz becomes the samples the
    resampler makes at the model's 16 kHz; a plain array (16 kHz) passes unchanged; a bad rate
    is refused naming the field."""
    import numpy as np

    from harness.checkpoints.spec import ModelSpec
    from harness.inputs.requests import AudioClip, Request
    from harness.targets.reference.requests import at_the_model_rate
    from harness.targets.reference.target import ReferenceTarget

    model = ReferenceTarget().model(ModelSpec(), torch.device("cpu")).multimodal
    clip = (0.1 * np.sin(np.arange(4410) / 7.0)).astype(np.float32)
    plain = np.zeros(160, dtype=np.float32)
    loaded = at_the_model_rate(
        model, Request("<so_embedding>", audios=[AudioClip(clip, 44100), plain])
    )
    expected = resample(torch.from_numpy(clip), 44100, 16000).numpy()
    assert np.array_equal(loaded.audios[0], expected)
    assert loaded.audios[0].shape == (1600,)
    assert loaded.audios[1] is plain
    with pytest.raises(ValueError, match=r"AudioClip\.rate: expected a positive int"):
        AudioClip(clip, 0)
