"""The reference model on CUDA gives what it gives on CPU (run: pytest -m gpu --device cuda)."""

from __future__ import annotations

import pytest
import torch

from harness.checkpoints.spec import ModelSpec
from harness.inputs import model_kwargs
from harness.oracles.assertions import assert_same_tensors
from harness.targets.reference import ReferenceTarget

pytestmark = pytest.mark.gpu


def test_embeddings_pass_through_on_cuda(device):
    model = ReferenceTarget().model(ModelSpec(), device)
    group = model_kwargs.embeddings(model.spec, "video_embeds", [4, 4, 4], stacked=True)
    out = model.embed_multimodal(**group.kwargs)
    assert all(o.device.type == "cuda" for o in out)
    assert_same_tensors(out, group.expected, "video_embeds")


def test_encoded_modalities_match_cpu(device):
    spec = ModelSpec()
    groups = [
        model_kwargs.image_pixels(spec, [2, 1]),
        model_kwargs.video_pixels(spec, [3]),
        model_kwargs.audio_features(spec, [2]),
    ]
    kwargs = model_kwargs.combine(groups)
    target = ReferenceTarget()
    on_cuda = target.model(spec, device).embed_multimodal(**kwargs)
    on_cpu = target.model(spec, torch.device("cpu")).embed_multimodal(**kwargs)
    assert len(on_cuda) == len(on_cpu) == 4
    for gpu_out, cpu_out in zip(on_cuda, on_cpu, strict=True):
        assert gpu_out.device.type == "cuda"
        # fp32 matmuls on GPU may use TF32: a tolerance a little above fp32 rounding.
        torch.testing.assert_close(gpu_out.cpu(), cpu_out, rtol=2e-3, atol=2e-3)
