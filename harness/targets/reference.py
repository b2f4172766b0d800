"""The ``reference`` target: our wrapper in ``reference_impl/``."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import torch
from torch import nn

import reference_impl
from harness.targets.base import (
    EncoderCalls,
    ModelShell,
    ParsedModality,
    ShellSpec,
    Target,
    TargetIdentity,
    sha256_of,
)
from harness.targets.fakes import (
    FakeSoundEncoder,
    FakeVisionCore,
    FakeVisionTower,
    seeded_mlp1,
)
from reference_impl.model import NanoNemotronVLModel
from reference_impl.tokenizer import VOCAB_SIZE, shared_tokenizer


class ReferenceShell(ModelShell):
    def __init__(self, spec: ShellSpec, device: torch.device) -> None:
        calls = EncoderCalls()
        super().__init__(spec, calls, device)
        core = FakeVisionCore(spec, calls)
        embed = nn.Embedding(VOCAB_SIZE, spec.hidden_size)
        with torch.no_grad():
            embed.weight.copy_(
                torch.randn(embed.weight.shape, generator=torch.Generator().manual_seed(7))
            )
        self.model = NanoNemotronVLModel(
            spec.vl_config(),
            vision_model=FakeVisionTower(core),
            embed_tokens=embed,
            tokenizer=shared_tokenizer(),
            sound_encoder=FakeSoundEncoder(spec, calls) if spec.audio else None,
        )
        self.model.connector.mlp1 = seeded_mlp1(spec.vl_config())
        self.model.to(device)

    def _parse(self, **kwargs: object) -> dict[str, ParsedModality]:
        parsed = self.model.parse_multimodal_inputs(**kwargs)
        normalised: dict[str, ParsedModality] = {}
        for modality in parsed:
            inputs = parsed[modality]  # type: ignore[literal-required]  # keys of the TypedDict
            normalised[modality] = ParsedModality(inputs.kind, inputs.num_items)
        return normalised

    def _embed(
        self, placeholder_counts: list[int] | None, **kwargs: object
    ) -> tuple[torch.Tensor, ...]:
        return self.model.embed_multimodal(placeholder_counts=placeholder_counts, **kwargs)


class ReferenceTarget(Target):
    devices = frozenset({"cpu", "cuda"})
    deviations_name = "reference"

    @property
    def name(self) -> str:
        return "reference"

    def identity(self) -> TargetIdentity:
        root = Path(reference_impl.__file__).parent
        try:
            version = metadata.version("nemotron-vl-conformance")
        except metadata.PackageNotFoundError:
            version = "source tree"
        files = {f"reference_impl/{p.name}": sha256_of(p) for p in sorted(root.glob("*.py"))}
        return TargetIdentity(name="reference", version=version, files=files)

    def build_shell(self, spec: ShellSpec, device: torch.device) -> ModelShell:
        return ReferenceShell(spec, device)
