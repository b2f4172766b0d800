"""The request catalogue and its runner: vLLM's ``multi_modal_data`` forms, and each form run
once per process with its outcome (result or exception) kept."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from harness.inputs.catalogue import FORMS_BY_NAME, REQUEST_FORMS
from harness.inputs.media import (
    sampled_clip,
    video_clip,
    video_file_with_audio,
    video_file_without_audio,
)
from harness.inputs.requests import AUDIO_SAMPLE_RATE, PLACEHOLDER, Request
from harness.plugin.target import RequestRuns
from harness.targets.reference import ReferenceTarget
from harness.targets.vllm.requests import multi_modal_data, processor_kwargs


def test_media_in_vllms_multi_modal_data_form():
    """Images as given; a video as ``(frames, metadata)`` with the metadata vLLM's video loader
    gives (``video_needs_metadata``); audio as ``(samples, sampling rate)``."""
    clip = video_clip(3, 8, 8, seed=0, stride=2)
    audio = np.zeros(1600, dtype=np.float32)
    request = Request("<image><video><so_embedding>", images=["pil"], videos=[clip], audios=[audio])
    data = multi_modal_data(request)
    assert data["image"] == ["pil"]
    [(frames, metadata)] = data["video"]
    assert frames is clip.frames
    assert metadata == {
        "fps": 2.0,
        "frames_indices": [0, 2, 4],
        "total_num_frames": 5,
        "duration": 2.5,
        "video_backend": "opencv",
    }
    assert data["audio"] == [(audio, AUDIO_SAMPLE_RATE)]


def test_a_sampled_clip_has_the_indices_a_loader_samples():
    """By hand: 10 s at 24000/1001 fps is round(239.76) = 240 source frames; 4 sampled from
    them sit at linspace(0, 239, 4) = 0, 79.67, 159.33, 239, cast to int."""
    clip = sampled_clip(4, 6, 10, seed=0, fps=24000 / 1001, seconds=10.0)
    assert clip.frames_indices == (0, 79, 159, 239)
    assert clip.frames.shape == (4, 6, 10, 3)
    assert clip.fps == 24000 / 1001
    # A clip shorter than the frames asked for gives all of its frames.
    assert sampled_clip(16, 6, 10, seed=0, fps=2.0, seconds=1.0).frames_indices == (0, 1)
    with pytest.raises(ValueError, match=r"fps, seconds: expected positive numbers, got 0"):
        sampled_clip(4, 6, 10, seed=0, fps=0, seconds=1.0)


def test_a_video_file_holds_its_frames_and_its_audio_track():
    """The file's track, read back with PyAV: 16 kHz mono PCM of exactly the length asked; the
    frames decoded from it; the bytes in the metadata as vLLM's ``nemotron_vl`` loader keeps
    them, and ``use_audio_in_video`` among the processor options."""
    import av

    video = video_file_with_audio(1.5, seed=3)
    with av.open(io.BytesIO(video.data), "r") as container:
        [stream] = container.streams.audio
        samples = sum(frame.samples for frame in container.decode(stream))
        assert (stream.rate, stream.channels) == (AUDIO_SAMPLE_RATE, 1)
    assert samples == 1.5 * AUDIO_SAMPLE_RATE
    assert video.frames.shape == (2, 64, 64, 3)
    request = Request("<video>", videos=[video], audio_in_video=True)
    [(frames, metadata)] = multi_modal_data(request)["video"]
    assert frames is video.frames
    assert metadata["original_video_bytes"] is video.data
    assert processor_kwargs(request) == {"use_audio_in_video": True}
    assert processor_kwargs(Request("<video>", videos=[video])) == {}

    silent = video_file_without_audio(seed=4)
    with av.open(io.BytesIO(silent.data), "r") as container:
        assert not container.streams.audio
        assert len(container.streams.video) == 1


@pytest.mark.parametrize("stacked", [True, False])
def test_embeddings_pass_as_given(stacked):
    rows = [torch.randn(3, 8), torch.randn(3, 8)]
    given = torch.stack(rows) if stacked else rows
    request = Request("<image><image>", images=given)
    assert multi_modal_data(request)["image"] is given
    assert all(torch.equal(a, b) for a, b in zip(request.embeddings("image"), rows, strict=True))
    assert request.embeddings("video") is None


def test_every_form_has_one_item_per_placeholder():
    for form in REQUEST_FORMS:
        request = form.request
        for modality, placeholder in PLACEHOLDER.items():
            assert request.prompt.count(placeholder) == request.num_items(modality), form.name


def test_a_form_runs_once_and_a_failure_is_kept(monkeypatch):
    runs = RequestRuns(ReferenceTarget(), torch.device("cpu"))
    model = runs.model("audios")
    calls = []
    real = model.run_request

    def counted(request, *, cached=False):
        calls.append(cached)
        return real(request, cached=cached)

    monkeypatch.setattr(model, "run_request", counted)
    first = runs.run("audios")
    assert runs.run("audios") is first
    assert calls == [False]

    def failing(request, *, cached=False):
        calls.append(cached)
        raise ValueError("images: broken")

    monkeypatch.setattr(model, "run_request", failing)
    for _ in range(2):
        with pytest.raises(ValueError, match="images: broken"):
            runs.run("audios", cached=True)
    assert calls == [False, True]
    assert FORMS_BY_NAME["audios"].spec == runs.model("audios").spec
