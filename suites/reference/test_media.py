"""A video file's audio track in the reference: decoding with PyAV against the tone the file was
made with and against vLLM's own decoder, the duration cap (declared and decoded), files
without a track or not readable, and the processor's ``audio_in_video`` prompt layout.

Test media are made here with PyAV (a few frames and a tone in a Matroska file), never
downloaded."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest
import torch

from harness.inputs.media import video_file, video_file_with_audio, video_file_without_audio
from reference_impl import media, presets
from reference_impl.audio import audio_token_count
from reference_impl.errors import ConfigError
from reference_impl.processor import NanoNemotronVLProcessor, Video
from reference_impl.tokenizer import (
    AUDIO_CONTEXT,
    IMG_CONTEXT,
    VIDEO_PLACEHOLDER,
    VOCAB_SIZE,
    shared_tokenizer,
)
from suites.harness.helpers import needs_vllm

OMNI = presets.tiny_vl_config(presets.nemotron_3_nano_omni(), VOCAB_SIZE)  # has a sound_config
NO_AUDIO = presets.tiny_vl_config(presets.nemotron_nano_12b_v2_vl(), VOCAB_SIZE)
RATE = 16000


def tone(seconds: float) -> np.ndarray:
    """The track :func:`harness.inputs.media.video_file` writes, as float samples: a 440 Hz sine at
    0.3 of full scale in 16-bit PCM, read back as ``int16 / 32768``."""
    t = np.arange(round(seconds * RATE)) / RATE
    return (0.3 * 32767 * np.sin(2 * np.pi * 440.0 * t)).astype(np.int16) / 32768.0


def stereo_file(seconds: float, rate: int) -> bytes:
    """A Matroska file with one stereo 16-bit track at ``rate``: left the 440 Hz tone, right
    silence (mixed down to mono, half the tone's amplitude or its 1/sqrt(2): FFmpeg's choice)."""
    import av

    buffer = io.BytesIO()
    n = round(seconds * rate)
    left = (0.3 * 32767 * np.sin(2 * np.pi * 440.0 * np.arange(n) / rate)).astype(np.int16)
    pcm = np.stack([left, np.zeros_like(left)], axis=1).reshape(1, -1)
    with av.open(buffer, "w", format="matroska") as container:
        stream = container.add_stream("pcm_s16le", rate=rate, layout="stereo")
        frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="stereo")
        frame.sample_rate, frame.pts = rate, 0
        container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return buffer.getvalue()


def test_the_track_is_the_tone_it_was_made_with():
    samples = media.audio_track(video_file_with_audio(1.5, 1).data, RATE, 600, "videos[0].data")
    assert samples is not None
    assert samples.dtype == torch.float32
    expected = tone(1.5)
    assert samples.shape == (len(expected),)
    torch.testing.assert_close(samples.double(), torch.from_numpy(expected), atol=1e-6, rtol=0)


def test_another_rate_and_channels_are_mixed_down_and_resampled():
    samples = media.audio_track(stereo_file(1.0, 44100), RATE, 600, "videos[0].data")
    assert samples is not None
    assert abs(len(samples) - RATE) <= 32, f"{len(samples)} samples for 1 s at {RATE} Hz"
    peak = float(samples[1000:-1000].abs().max())
    assert 0.3 * 0.45 < peak < 0.3 * 0.75, f"peak {peak}: not the left channel mixed down"


def test_an_infinite_cap_is_no_cap():
    samples = media.audio_track(video_file_with_audio(1.0, 12).data, RATE, float("inf"), "v")
    assert samples is not None
    assert len(samples) == RATE


def test_a_file_without_a_track_has_none():
    assert media.audio_track(video_file_without_audio(2).data, RATE, 600, "videos[0].data") is None


@pytest.mark.parametrize(
    "data", [b"", b"not a media file", bytes(64)], ids=["empty", "text", "zeros"]
)
def test_an_unreadable_file_is_refused_naming_it(data):
    with pytest.raises(ConfigError, match=r"'videos\[0\]\.data': expected a readable media"):
        media.audio_track(data, RATE, 600, "videos[0].data")


def test_a_track_declared_over_the_cap_is_refused_before_decoding(monkeypatch):
    import av

    data = video_file_with_audio(5.0, 2).data
    decoded: list[object] = []
    real_decode = av.container.InputContainer.decode
    monkeypatch.setattr(
        av.container.InputContainer,
        "decode",
        lambda self, *a, **k: decoded.append(a) or real_decode(self, *a, **k),
    )
    with pytest.raises(ConfigError, match=r"at most 3 s .*got 'a track declared 5\.0 s long'"):
        media.audio_track(data, RATE, 3, "videos[0].data")
    assert decoded == [], "the track was decoded though its declared length is over the cap"


def test_a_track_that_declares_no_length_stops_at_the_cap(monkeypatch):
    """A container that states no length is decoded until the samples pass the cap, then
    refused: never decoded whole."""
    monkeypatch.setattr(media, "_declared_seconds", lambda container, stream: None)
    with pytest.raises(ConfigError, match=r"at most 3 s .*got 'more than 3\.\d s decoded'"):
        media.audio_track(video_file_with_audio(30.0, 3).data, RATE, 3, "videos[0].data")


@needs_vllm
@pytest.mark.vllm
def test_the_samples_are_vllms():
    """vLLM's ``load_audio_pyav`` asked for the same rate gives the same samples: a 44.1 kHz
    stereo track mixed down and resampled by FFmpeg in both. vLLM does not flush the
    resampler, so its last few samples (FFmpeg's filter delay) are missing: the reference's
    decode is the whole second, vLLM's a prefix of it."""
    from harness.oracles.vllm_layers import init_cpu_runtime

    init_cpu_runtime()
    from vllm.multimodal.media.audio import load_audio_pyav

    data = stereo_file(1.0, 44100)
    theirs, rate = load_audio_pyav(io.BytesIO(data), sr=RATE, max_duration_s=600)
    ours = media.audio_track(data, RATE, 600, "videos[0].data")
    assert rate == RATE
    assert ours is not None
    assert len(ours) == RATE
    assert RATE - 64 <= len(theirs) <= RATE
    torch.testing.assert_close(
        ours[: len(theirs)], torch.from_numpy(np.asarray(theirs, dtype=np.float32))
    )


# ---------------------------------------------------------------------------------------------
# The processor's audio_in_video


def _video(file) -> Video:
    return Video(torch.from_numpy(file.frames.copy()), file.fps, file.frames_indices, file.data)


def _process(text: str, videos: list[Video], config=OMNI, **kwargs) -> object:
    return NanoNemotronVLProcessor(config, shared_tokenizer())(
        text, videos=videos, audio_in_video=True, **kwargs
    )


def test_each_track_follows_its_video_and_a_silent_video_stays_alone():
    loud, silent = video_file_with_audio(2.0, 5), video_file_without_audio(6)
    out = _process("A <video> B <video> C", [_video(loud), _video(silent)])
    spans = [(p.modality, p.index) for p in sorted(out.placeholders, key=lambda p: p.start)]
    assert spans == [("videos", 0), ("audios", 0), ("videos", 1)]
    # The same prompt written out by hand, the track given as an audio item.
    by_hand = NanoNemotronVLProcessor(OMNI, shared_tokenizer())(
        f"A {VIDEO_PLACEHOLDER}{AUDIO_CONTEXT} B {VIDEO_PLACEHOLDER} C",
        videos=[_video(loud), _video(silent)],
        audios=[torch.from_numpy(tone(2.0).astype(np.float32))],
    )
    assert out.input_ids == by_hand.input_ids
    audio = next(p for p in out.placeholders if p.modality == "audios")
    assert OMNI.sound_config is not None
    assert audio.length == audio_token_count(2 * RATE, OMNI.sound_config)


def test_tracks_given_with_the_request_are_used_one_per_video():
    loud = video_file_with_audio(2.0, 7)
    track = torch.zeros(RATE)
    out = _process("<video>", [_video(loud)], audios=[track])
    assert [p.modality for p in out.placeholders] == ["videos", "audios"]
    with pytest.raises(ConfigError, match=r"'audios': expected one track per video"):
        _process("<video>", [_video(loud)], audios=[track, track])


@pytest.mark.parametrize("data", [None, b""], ids=["none", "empty"])
def test_a_video_without_its_bytes_is_refused_naming_it(data):
    file = video_file_with_audio(2.0, 8)
    video = dataclasses.replace(_video(file), data=data)
    with pytest.raises(ConfigError, match=r"'videos\[0\]\.data': expected the video file's bytes"):
        _process("<video>", [video])


def test_a_model_without_audio_refuses_audio_in_video():
    file = video_file_with_audio(2.0, 9)
    with pytest.raises(ConfigError, match=r"'audio_in_video': expected a model with a sound"):
        _process("<video>", [_video(file)], config=NO_AUDIO)


def test_the_placeholder_count_must_match_the_videos():
    file = video_file(2, 64, 64, 10, audio_seconds=1.0)
    with pytest.raises(ConfigError, match=r"'videos': expected one item per <video>"):
        _process("<video> <video>", [_video(file)])


def test_the_video_itself_is_unchanged_by_its_track():
    file = video_file_with_audio(2.0, 11)
    plain = NanoNemotronVLProcessor(OMNI, shared_tokenizer())("<video>", videos=[_video(file)])
    with_track = _process("<video>", [_video(file)])
    context = shared_tokenizer().convert_tokens_to_ids(IMG_CONTEXT)
    video = next(p for p in with_track.placeholders if p.modality == "videos")
    assert with_track.input_ids[: video.length] == plain.input_ids
    assert plain.input_ids.count(context) == with_track.input_ids.count(context)
