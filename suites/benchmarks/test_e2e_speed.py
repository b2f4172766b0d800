"""End-to-end speed of the tiny Omni preset: text + 2 images + 1 video + 1 audio -> 8 tokens.

The target (under 10 s on CPU, model construction included) is checked by
``harness.jobs.bench_report``, not asserted here.
"""

from __future__ import annotations

import pytest
import torch

from reference_impl import presets
from reference_impl.model import NanoNemotronVLForConditionalGeneration
from reference_impl.processor import NanoNemotronVLProcessor, Video
from reference_impl.tokenizer import VOCAB_SIZE, shared_tokenizer

pytestmark = pytest.mark.bench


def run_once() -> list[int]:
    torch.manual_seed(0)
    config = presets.tiny_vl_config(presets.nemotron_3_nano_omni(), VOCAB_SIZE)
    model = NanoNemotronVLForConditionalGeneration(config, shared_tokenizer()).eval()
    proc = NanoNemotronVLProcessor(config, shared_tokenizer())
    gen = torch.Generator().manual_seed(0)
    images = [
        torch.randint(0, 256, (40, 70, 3), generator=gen, dtype=torch.uint8),
        torch.randint(0, 256, (64, 32, 3), generator=gen, dtype=torch.uint8),
    ]
    video = Video(torch.randint(0, 256, (3, 48, 48, 3), generator=gen, dtype=torch.uint8))
    audio = torch.randn(8000, generator=gen) * 0.1
    prompt = proc(
        "Look at <image> and <image>, watch <video>, hear <so_embedding>.",
        images=images,
        videos=[video],
        audios=[audio],
    )
    return model.generate(prompt, 8)


def test_end_to_end_tiny_omni(benchmark):
    torch.set_num_threads(2)
    benchmark.group = "end to end"
    benchmark.extra_info.update(kind="e2e")
    tokens = benchmark.pedantic(run_once, rounds=3, warmup_rounds=1)
    assert len(tokens) == 8


def build_and_forward(name: str) -> int:
    """A shrunk preset (the minimal-layer builder): construct it and run one forward pass."""
    torch.manual_seed(0)
    config = presets.tiny_vl_config(getattr(presets, name)(), VOCAB_SIZE)
    model = NanoNemotronVLForConditionalGeneration(config, shared_tokenizer()).eval()
    proc = NanoNemotronVLProcessor(config, shared_tokenizer())
    prompt = proc("Describe <image>.", images=[torch.zeros(32, 48, 3, dtype=torch.uint8)])
    with torch.no_grad():
        logits = model(
            torch.tensor(prompt.input_ids),
            torch.tensor(prompt.is_multimodal),
            prompt.placeholders,
            **prompt.mm_kwargs,
        )
    return int(logits.shape[0])


@pytest.mark.parametrize("name", ["nemotron_nano_12b_v2_vl", "nemotron_3_nano_omni"])
def test_shrunk_preset_build_and_forward(benchmark, name):
    torch.set_num_threads(2)
    benchmark.group = "shrunk presets"
    benchmark.extra_info.update(kind="minimal-config", preset=name)
    assert benchmark.pedantic(build_and_forward, args=(name,), rounds=3, warmup_rounds=1) > 0
