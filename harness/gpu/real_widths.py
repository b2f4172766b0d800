"""The reference's layers at the published widths: one block of each kind of each preset, for the
bf16-on-CUDA parity check (``suites/gpu/test_reference_real_widths.py``) and the throughput
report (``nemotron-vl-gpu-throughput``).

A block is ``x + mixer(norm(x))`` with the preset's config; its weights are drawn from a fixed
seed (PyTorch's default initialisations, the router's weights ``N(0, 1/H)`` and its correction
bias ``N(0, 0.01^2)`` so routing is neither tied nor uniform), so every run builds the same layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from reference_impl.config import NemotronHConfig, VLConfig
from reference_impl.nemotron_h import Block, Router
from reference_impl.presets import nemotron_3_nano_omni, nemotron_nano_12b_v2_vl

#: The presets, by the names the reports use.
PRESETS: dict[str, Callable[[], VLConfig]] = {
    "12b-v2": nemotron_nano_12b_v2_vl,
    "omni": nemotron_3_nano_omni,
}
#: Layer kinds that keep state between steps (decode reads a cache).
STATEFUL = ("mamba", "attention")


@dataclass(frozen=True)
class LayerCase:
    """One layer kind of one preset: the block at its first occurrence in the pattern."""

    preset: str
    kind: str
    layer: int

    @property
    def id(self) -> str:
        return f"{self.preset}-{self.kind}"

    def config(self) -> NemotronHConfig:
        return text_config(self.preset)


def text_config(preset: str) -> NemotronHConfig:
    """The preset's language-model config (every preset has one)."""
    text = PRESETS[preset]().text_config
    assert text is not None, f"preset {preset!r} has no text_config"
    return text


def layer_cases() -> list[LayerCase]:
    """Every layer kind of every preset (12B v2: mamba, attention, mlp; Omni: mamba, moe,
    attention), in pattern order."""
    cases = []
    for preset in PRESETS:
        kinds = text_config(preset).layer_kinds
        for kind in dict.fromkeys(kinds):
            cases.append(LayerCase(preset, kind, kinds.index(kind)))
    return cases


def build_block(case: LayerCase, seed: int = 0, device: str = "cpu") -> Block:
    """The case's block in fp32 on ``device``, weights from ``seed`` (module docstring; the
    same weights only for the same device)."""
    config = case.config()
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        block = Block(config, case.layer).eval()
        for module in block.modules():
            if isinstance(module, Router):
                module.weight.data.normal_(0.0, config.hidden_size**-0.5)
                module.e_score_correction_bias.data.normal_(0.0, 0.01)
    return block


def hidden_states(case: LayerCase, batch: int, length: int, seed: int = 1) -> torch.Tensor:
    """``[batch, length, H]`` inputs in fp32, unit variance."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, length, case.config().hidden_size, generator=g)
