"""LoRA adapters as users ship them, written for a checkpoint folder.

An adapter folder is what PEFT saves and what vLLM's ``--lora-modules`` and ``LoRARequest`` read:
``adapter_config.json`` (``peft_type`` LORA, ``r``, ``lora_alpha``, ``target_modules``,
``use_rslora``, ...) and ``adapter_model.safetensors`` with PEFT's key naming,
``base_model.model.<module>.lora_A.weight`` ``[r, in]`` and ``...lora_B.weight`` ``[out, r]``
for a linear layer, ``base_model.model.<module>.lora_embedding_A`` ``[r, vocab]`` and
``...lora_embedding_B`` ``[h, r]`` for an embedding. ``<module>`` is the checkpoint's module name
(``language_model.backbone.layers.2.mixer.q_proj``), as an adapter trained on the checkpoint
names it.

:class:`AdapterSpec` names an adapter: its ``target_modules`` with PEFT's meaning (a list: every
module whose name is an entry or ends with ``.<entry>``; a string: a regular expression the
whole module name matches), rank, alpha and rsLoRA. The writer adapts every linear layer (every
2-D ``.weight`` of the checkpoint) and the embedding that the targets match; A and B are seeded
random, B non-zero (a freshly initialised PEFT adapter has B = 0 and changes nothing), scaled so
that the delta ``(alpha / r) B A x`` is about a tenth of the layer's output.
"""

from __future__ import annotations

import atexit
import functools
import json
import math
import re
import shutil
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.checkpoints.cache import checkpoint_weights
from harness.checkpoints.spec import ModelSpec

#: The checkpoint module of the token embedding (PEFT's ``lora_embedding_*`` keys).
EMBEDDING_MODULE = "language_model.backbone.embeddings"
PEFT_PREFIX = "base_model.model."

#: The language model's projections, by their checkpoint module names.
LM_PROJECTIONS = (
    r"language_model\.backbone\.layers\.\d+\.mixer\."
    r"(q_proj|k_proj|v_proj|o_proj|up_proj|down_proj|in_proj|out_proj)"
)


@dataclass(frozen=True)
class AdapterSpec:
    """A LoRA adapter for a checkpoint folder (see the module docstring)."""

    name: str
    target_modules: tuple[str, ...] | str
    rank: int = 8
    alpha: float = 16.0
    use_rslora: bool = False
    seed: int = 0
    #: The module name the embedding's factors are saved under: the checkpoint's
    #: (``language_model.backbone.embeddings``), or another naming (vLLM's module name).
    embedding_name: str = EMBEDDING_MODULE

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"AdapterSpec.rank: expected a positive rank, got {self.rank!r}")
        if isinstance(self.target_modules, str):
            try:
                re.compile(self.target_modules)
            except re.error as e:
                raise ValueError(
                    f"AdapterSpec.target_modules: expected a regular expression, got "
                    f"{self.target_modules!r} ({e})"
                ) from None
        elif not self.target_modules:
            raise ValueError("AdapterSpec.target_modules: expected at least one module, got ()")

    @property
    def scaling(self) -> float:
        """PEFT's scaling of the delta: ``alpha / r``, rsLoRA ``alpha / sqrt(r)``."""
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)

    def targets(self, module: str) -> bool:
        """Whether PEFT would adapt ``module`` (a checkpoint module name)."""
        if isinstance(self.target_modules, str):
            return re.fullmatch(self.target_modules, module) is not None
        return any(module == t or module.endswith(f".{t}") for t in self.target_modules)

    def config(self) -> dict[str, object]:
        """``adapter_config.json``: PEFT's LORA config."""
        target = self.target_modules
        return {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": "nemotron-vl-tiny",
            "r": self.rank,
            "lora_alpha": self.alpha,
            "lora_dropout": 0.0,
            "target_modules": target if isinstance(target, str) else list(target),
            "bias": "none",
            "use_rslora": self.use_rslora,
            "use_dora": False,
            "fan_in_fan_out": False,
            "modules_to_save": None,
            "init_lora_weights": True,
        }


#: The towers' linear layers: RADIO's attention and MLP, Parakeet's attention.
TOWER_LINEARS = (
    r"vision_model\..*\.(qkv|proj|fc1|fc2)|sound_encoder\..*\.(q_proj|k_proj|v_proj|o_proj)"
)
LM_EMBEDDINGS = rf"{LM_PROJECTIONS}|language_model\.backbone\.embeddings|language_model\.lm_head"

ADAPTERS: tuple[AdapterSpec, ...] = (
    # Every projection of the language model (attention, MLP, Mamba).
    AdapterSpec("lm-projections", LM_PROJECTIONS),
    AdapterSpec("rank-4", LM_PROJECTIONS, rank=4, alpha=8.0, seed=4),
    AdapterSpec("rslora", LM_PROJECTIONS, rank=8, alpha=4.0, use_rslora=True, seed=5),
    # Some of the projections only: its slot must hold nothing for the others.
    AdapterSpec(
        "attention-only",
        r"language_model\.backbone\.layers\.\d+\.mixer\.(q_proj|k_proj|v_proj|o_proj)",
        seed=8,
    ),
    # ... and the token embedding and the head, named as the checkpoint names them.
    AdapterSpec("lm-embeddings", LM_EMBEDDINGS, seed=1),
    # The same, the embedding saved under vLLM's module name (``embed_tokens``).
    AdapterSpec(
        "lm-embeddings-vllm-names",
        LM_EMBEDDINGS,
        seed=1,
        embedding_name="language_model.model.embed_tokens",
    ),
    # Module names as a user lists them for the whole model: the language model's projections,
    # and with them RADIO's qkv / fc1 / fc2 and Parakeet's attention.
    AdapterSpec(
        "with-towers",
        ("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj", "qkv", "fc1", "fc2"),
        seed=2,
    ),
    # The towers alone; and the towers and the connector.
    AdapterSpec("towers-only", TOWER_LINEARS, seed=3),
    AdapterSpec("towers-and-connector", rf"{TOWER_LINEARS}|mlp1\.[13]", seed=6),
)
ADAPTERS_BY_NAME = {adapter.name: adapter for adapter in ADAPTERS}


def adapter_tensors(spec: ModelSpec, adapter: AdapterSpec) -> dict[str, torch.Tensor]:
    """``adapter``'s tensors for ``spec``'s checkpoint, in PEFT's key naming (fp32)."""
    weights = checkpoint_weights(spec)
    tensors: dict[str, torch.Tensor] = {}
    for name, weight in sorted(weights.items()):
        module = name.removesuffix(".weight")
        if not name.endswith(".weight") or weight.dim() != 2 or not adapter.targets(module):
            continue
        out_features, in_features = weight.shape
        g = torch.Generator().manual_seed(adapter.seed * 1_000_003 + zlib.crc32(module.encode()))
        r = adapter.rank
        # Each factor N(0, 1/fan_in): B A x ~ x's scale; the scaling and 0.1 make it a tenth.
        a = torch.randn(r, in_features, generator=g) / math.sqrt(in_features)
        b = torch.randn(out_features, r, generator=g) * (0.1 / math.sqrt(r)) / adapter.scaling
        if module == EMBEDDING_MODULE:
            # An embedding: A [r, vocab] looks a token up, B [h, r] maps it out.
            vocab, hidden = weight.shape
            a = torch.randn(r, vocab, generator=g)
            b = torch.randn(hidden, r, generator=g) * (0.1 / math.sqrt(r * hidden))
            b = b / adapter.scaling
            tensors[f"{PEFT_PREFIX}{adapter.embedding_name}.lora_embedding_A"] = a
            tensors[f"{PEFT_PREFIX}{adapter.embedding_name}.lora_embedding_B"] = b
            continue
        tensors[f"{PEFT_PREFIX}{module}.lora_A.weight"] = a
        tensors[f"{PEFT_PREFIX}{module}.lora_B.weight"] = b
    if not tensors:
        raise ValueError(
            f"adapter {adapter.name!r}: target_modules {adapter.target_modules!r} match no "
            f"linear layer of the {spec.slug} checkpoint"
        )
    return tensors


def write_adapter(spec: ModelSpec, adapter: AdapterSpec, folder: Path) -> Path:
    """Write ``adapter``'s PEFT folder for ``spec``'s checkpoint into ``folder``; returns it."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps(adapter.config(), indent=2))
    save_file(
        adapter_tensors(spec, adapter),
        str(folder / "adapter_model.safetensors"),
        metadata={"format": "pt"},
    )
    return folder


@functools.cache
def _adapters_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="nemotron-vl-adapters-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


@functools.cache
def adapter_folder(spec: ModelSpec, adapter: AdapterSpec) -> Path:
    """``adapter``'s folder for ``spec``'s checkpoint, written once per process into a
    temporary folder removed at exit."""
    spec = spec.checkpoint
    return write_adapter(spec, adapter, _adapters_root() / f"{spec.slug}-{adapter.name}")


#: Ways an adapter folder is broken, and the field (file or module) a clear error names.
BROKEN_ADAPTERS = {
    "rank-above-max": "max_lora_rank",
    "unknown-module": "gate_proj",
    "corrupt-file": "adapter_model.safetensors",
    "missing-file": "adapter_model.safetensors",
    "extends-vocabulary": "added_tokens.json",
}


def write_broken_adapter(spec: ModelSpec, kind: str, folder: Path, max_lora_rank: int) -> Path:
    """An adapter folder broken as :data:`BROKEN_ADAPTERS` names ``kind``: rank above
    ``max_lora_rank``; a target module the model lacks (``...mixer.gate_proj``); a safetensors
    file of garbage, or none; an adapter that adds tokens to the vocabulary (PEFT's
    ``added_tokens.json`` and ``new_embeddings.safetensors``)."""
    from safetensors.torch import save_file

    if kind not in BROKEN_ADAPTERS:
        raise ValueError(
            f"write_broken_adapter: kind: expected one of {sorted(BROKEN_ADAPTERS)}, got {kind!r}"
        )
    rank = 2 * max_lora_rank if kind == "rank-above-max" else 4
    adapter = AdapterSpec(f"broken-{kind}", LM_PROJECTIONS, rank=rank, alpha=2.0 * rank, seed=7)
    write_adapter(spec, adapter, folder)
    weights = folder / "adapter_model.safetensors"
    if kind == "unknown-module":
        tensors = adapter_tensors(spec, adapter)
        hidden = spec.hidden_size
        module = f"{PEFT_PREFIX}language_model.backbone.layers.0.mixer.gate_proj"
        tensors[f"{module}.lora_A.weight"] = torch.ones(rank, hidden)
        tensors[f"{module}.lora_B.weight"] = torch.ones(hidden, rank)
        save_file(tensors, str(weights), metadata={"format": "pt"})
    elif kind == "corrupt-file":
        weights.write_bytes(b"\x00 not a safetensors file " * 8)
    elif kind == "missing-file":
        weights.unlink()
    elif kind == "extends-vocabulary":
        # PEFT numbers added tokens from the end of the model's vocabulary.
        vocab = checkpoint_weights(spec)[f"{EMBEDDING_MODULE}.weight"].shape[0]
        (folder / "added_tokens.json").write_text(json.dumps({"<new_token>": vocab}))
        save_file(
            {
                "input_embeddings": torch.ones(1, spec.hidden_size),
                "output_embeddings": torch.ones(1, spec.hidden_size),
            },
            str(folder / "new_embeddings.safetensors"),
        )
    return folder


# ---------------------------------------------------------------------------------------------
# Adapters by name (the command line's --adapter)

#: ``--adapter`` names a broken adapter ``broken-<kind>``, one of ``BROKEN_ADAPTERS``'s kinds.
BROKEN_PREFIX = "broken-"
#: The ``--max-lora-rank`` a broken adapter is broken for (its ``rank-above-max`` kind: rank 16).
BROKEN_FOR_MAX_LORA_RANK = 8


def adapter_names() -> list[str]:
    """What ``--adapter`` writes: each adapter of :mod:`harness.checkpoints.lora_adapters` by name,
    and each broken kind as ``broken-<kind>``."""
    return [a.name for a in ADAPTERS] + [BROKEN_PREFIX + kind for kind in BROKEN_ADAPTERS]


def write_adapter_folder(spec: ModelSpec, name: str, folder: Path) -> Path:
    """Write the PEFT folder of the adapter :func:`adapter_names` calls ``name``, for ``spec``'s
    checkpoint, into ``folder`` (created); returns it."""
    if name.startswith(BROKEN_PREFIX):
        kind = name.removeprefix(BROKEN_PREFIX)
        return write_broken_adapter(spec, kind, Path(folder), BROKEN_FOR_MAX_LORA_RANK)
    if name not in ADAPTERS_BY_NAME:
        raise ValueError(
            f"write_adapter_folder: name: expected one of {adapter_names()}, got {name!r}"
        )
    return write_adapter(spec.checkpoint, ADAPTERS_BY_NAME[name], Path(folder))
