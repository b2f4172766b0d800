"""``--tensor-parallel-size 2``: every rank's loader fills each parameter with the shard the
architecture implies, and the ranks' shards put together are the unsharded parameter.

What is checked, on CPU, for the default checkpoint (``n_groups = 2``) at TP = 2:

- The target builds and loads the checkpoint folder once per rank with its own constructor,
  loader and ``weight_loader``s (vLLM: in one process, the tensor-parallel group's size and rank
  set to 2 and ``r``, see ``harness/targets/vllm/tensor_parallel.py``), and every rank has the
  parameters of the unsharded (TP = 1) model, by the same names.
- Each parameter of each rank equals, bit for bit and in shape, the slice computed here from the
  checkpoint's tensors and config by one rule per kind of layer (:data:`RULES`, keyed by
  parameter-name patterns; a parameter no rule covers fails the check, so a new one cannot pass
  silently). The rules, from the architecture (not from vLLM's code):

  - column-parallel (output dim 0 split in ``tp`` equal pieces, rank ``r`` the ``r``-th): MLP
    ``up_proj``; the fused ``qkv_proj`` split per part, q by heads and k, v by KV heads (with
    fewer KV heads than ranks, each KV head replicated on ``tp / KV`` consecutive ranks); the
    Mamba ``in_proj`` ``[z (I), x (I), B (G*N), C (G*N), dt (H)]`` split per block, z, x and dt
    by heads, B and C by groups (with ``n_groups`` not divisible by ``tp`` it must be 1, and
    every rank holds the one group whole); ``conv1d`` over ``[x, B, C]`` likewise; ``A``
    (``-exp(A_log)``), ``D``, ``dt_bias`` and the gated norm's weight (``I``, normalised within
    groups) by heads;
  - row-parallel (input dim 1 split, bias replicated: added once after the all-reduce):
    ``out_proj``, ``o_proj``, ``down_proj``;
  - vocab-parallel ``embed_tokens`` and ``lm_head``: the vocabulary padded to a multiple of 64
    rows (zero rows), split by rows;
  - RADIO blocks are tensor-parallel layers too: ``attn.qkv`` split per q/k/v by heads and
    ``attn.proj`` row-parallel when the heads divide among the ranks (else the attention is
    replicated), ``mlp.fc1`` column- and ``mlp.fc2`` row-parallel; their norms, layer scales
    (identity) and the patch generator replicated;
  - replicated whole on every rank: the language model's norms, ``mlp1`` (the vision projector)
    and the sound encoder with its projection (plain modules).
- Putting the ranks' shards together (pieces of a split block concatenated in rank order,
  ranks holding a replicated piece equal) gives the TP = 1 model's parameter exactly.

What cannot be checked here:

- forward passes under TP: each rank's layers all-reduce or all-gather their partial results,
  which needs a device communicator (a faked one-process group raises ``No device communicator
  found``) or one process per rank;
- MoE layers (the Omni language model): vLLM's FusedMoE refuses non-gated MoE on CPU;
- NCCL, custom all-reduce and the CUDA kernels a GPU deployment runs;
- ``n_groups`` not divisible by ``tp`` (group replication): :class:`ModelSpec` has no field for
  ``n_groups``, so no such checkpoint is written; the rule for it is here, unexercised.

On a target without tensor parallelism (the reference) the check skips with the target's
reason.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from harness.checkpoints.cache import checkpoint_folder, checkpoint_weights
from harness.checkpoints.serving import ServingConfig
from harness.checkpoints.spec import ModelSpec
from reference_impl.radio import RADIO_SIZES

pytestmark = pytest.mark.concern("weights")

TP = 2
SERVINGS = [ServingConfig(tensor_parallel_size=TP)]
SPEC = ModelSpec()
#: The vocabulary rows of a vocab-parallel layer are padded to a multiple of this.
VOCAB_PADDING = 64

# ---------------------------------------------------------------------------------------------
# The layout the architecture implies


@dataclass(frozen=True)
class Block:
    """A run of ``size`` rows (along the layout's dim) of the unsharded tensor, cut into
    ``pieces`` equal pieces: rank ``r`` of ``tp`` holds piece ``r * pieces // tp`` (``pieces ==
    tp``: split, one piece per rank; 1: replicated whole on every rank)."""

    size: int
    pieces: int


@dataclass(frozen=True)
class Layout:
    kind: str
    dim: int
    blocks: tuple[Block, ...]


@dataclass(frozen=True)
class Sizes:
    """The checkpoint config's sizes the rules use."""

    mamba_heads: int
    mamba_head_dim: int
    n_groups: int
    state: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    vision_heads: int

    @classmethod
    def of(cls, spec: ModelSpec) -> Sizes:
        config = json.loads((checkpoint_folder(spec) / "config.json").read_text())
        text = config["text_config"]
        hidden = text["hidden_size"]
        heads = text["num_attention_heads"]
        return cls(
            mamba_heads=text["mamba_num_heads"],
            mamba_head_dim=text["mamba_head_dim"],
            n_groups=text["n_groups"],
            state=text["ssm_state_size"],
            heads=heads,
            kv_heads=text["num_key_value_heads"],
            head_dim=text.get("head_dim") or hidden // heads,
            vocab=text["vocab_size"],
            vision_heads=RADIO_SIZES[config["vision_config"]["args"]["model"]][2],
        )


def split(size: int, tp: int) -> Block:
    assert size % tp == 0, f"{size} rows do not split among {tp} ranks"
    return Block(size, tp)


def whole(shape: torch.Size) -> Layout:
    return Layout("replicated", 0, (Block(shape[0] if len(shape) else 1, 1),))


def replicated(name: str, shape: torch.Size, s: Sizes, tp: int) -> Layout:
    return whole(shape)


def column(name: str, shape: torch.Size, s: Sizes, tp: int) -> Layout:
    return Layout("column-parallel", 0, (split(shape[0], tp),))


def row(name: str, shape: torch.Size, s: Sizes, tp: int) -> Layout:
    return Layout("row-parallel", 1, (split(shape[1], tp),))


def vocab(name: str, shape: torch.Size, s: Sizes, tp: int) -> Layout:
    padded = math.ceil(s.vocab / VOCAB_PADDING) * VOCAB_PADDING
    return Layout("vocab-parallel", 0, (split(padded, tp),))


def by_heads(count: int, width: int, tp: int) -> Block:
    """``count`` heads of ``width`` rows: split by heads, or, with fewer heads than ranks, each
    head replicated on ``tp / count`` consecutive ranks."""
    if count % tp == 0:
        return Block(count * width, tp)
    assert tp % count == 0, f"{count} heads neither split among nor replicate over {tp} ranks"
    return Block(count * width, count)


def groups(s: Sizes, tp: int) -> Block:
    """B or C: ``n_groups`` groups of ``state`` rows, split by groups; a single group is held
    whole by every rank (the only case allowed when the groups do not divide)."""
    if s.n_groups % tp == 0:
        return Block(s.n_groups * s.state, tp)
    assert s.n_groups == 1, f"n_groups={s.n_groups} neither divisible by tp={tp} nor 1"
    return Block(s.state, 1)


def mamba_in_proj(name: str, shape: torch.Size, s: Sizes, tp: int) -> Layout:
    z = x = by_heads(s.mamba_heads, s.mamba_head_dim, tp)
    b = c = groups(s, tp)
    return Layout("mamba in_proj", 0, (z, x, b, c, by_heads(s.mamba_heads, 1, tp)))


def mamba_conv(name: str, shape: torch.Size, s: Sizes, tp: int) -> Layout:
    x = by_heads(s.mamba_heads, s.mamba_head_dim, tp)
    return Layout("mamba conv1d", 0, (x, groups(s, tp), groups(s, tp)))


def mamba_per_head(name: str, shape: torch.Size, s: Sizes, tp: int) -> Layout:
    return Layout("mamba per head", 0, (by_heads(s.mamba_heads, 1, tp),))


def mamba_gated_norm(name: str, shape: torch.Size, s: Sizes, tp: int) -> Layout:
    return Layout("mamba gated norm", 0, (by_heads(s.mamba_heads, s.mamba_head_dim, tp),))


def attention_qkv(name: str, shape: torch.Size, s: Sizes, tp: int) -> Layout:
    q = by_heads(s.heads, s.head_dim, tp)
    kv = by_heads(s.kv_heads, s.head_dim, tp)
    return Layout("fused qkv", 0, (q, kv, kv))


def vision_attention_parallel(s: Sizes, tp: int) -> bool:
    return s.vision_heads % tp == 0


def vision_qkv(name: str, shape: torch.Size, s: Sizes, tp: int) -> Layout:
    width = shape[0] // 3
    pieces = tp if vision_attention_parallel(s, tp) else 1
    return Layout("vision qkv", 0, (Block(width, pieces),) * 3)


def vision_proj(name: str, shape: torch.Size, s: Sizes, tp: int) -> Layout:
    if vision_attention_parallel(s, tp):
        return row(name, shape, s, tp)
    return whole(shape)


LM_LAYER = r"language_model\.model\.layers\.\d+\."
#: RADIO's blocks: ``model.encoder.layers.N`` before vLLM 0.34.0, Transformers' tree
#: ``encoder.layer.N`` (``attention`` for ``attn``, ``layer_scale1.lambda1`` for ``ls1``) from it.
VISION_LAYER = r"vision_model\.(model\.encoder\.layers|encoder\.layer)\.\d+\."
ATTN = r"(attn|attention)"
Rule = Callable[[str, torch.Size, Sizes, int], Layout]
#: (vLLM parameter-name pattern, rule): every parameter must match exactly one.
RULES: list[tuple[str, Rule]] = [
    (r"language_model\.model\.embed_tokens\.weight", vocab),
    (r"language_model\.lm_head\.weight", vocab),
    (r"language_model\.model\.norm_f\.weight", replicated),
    (LM_LAYER + r"norm\.weight", replicated),
    (LM_LAYER + r"mixer\.in_proj\.(weight|bias)", mamba_in_proj),
    (LM_LAYER + r"mixer\.conv1d\.(weight|bias)", mamba_conv),
    (LM_LAYER + r"mixer\.(A|D|dt_bias)", mamba_per_head),
    (LM_LAYER + r"mixer\.norm\.weight", mamba_gated_norm),
    (LM_LAYER + r"mixer\.(out_proj|o_proj|down_proj)\.weight", row),
    (LM_LAYER + r"mixer\.(out_proj|o_proj|down_proj)\.bias", replicated),
    (LM_LAYER + r"mixer\.qkv_proj\.weight", attention_qkv),
    (LM_LAYER + r"mixer\.up_proj\.(weight|bias)", column),
    (r"vision_model\.(model\.patch_generator|embeddings)\..+", replicated),
    (VISION_LAYER + ATTN + r"\.qkv\.(weight|bias)", vision_qkv),
    (VISION_LAYER + ATTN + r"\.proj\.weight", vision_proj),
    (VISION_LAYER + r"mlp\.fc1\.(weight|bias)", column),
    (VISION_LAYER + r"mlp\.fc2\.weight", row),
    (VISION_LAYER + r"(" + ATTN + r"\.proj|mlp\.fc2)\.bias", replicated),
    (VISION_LAYER + r"(norm1|norm2)\.(weight|bias)", replicated),
    (VISION_LAYER + r"(ls[12]|layer_scale[12]\.lambda1)", replicated),
    (r"mlp1\..+", replicated),
    (r"sound_encoder\..+", replicated),
]


def layout(name: str, shape: torch.Size, s: Sizes, tp: int) -> Layout:
    rules = [rule for pattern, rule in RULES if re.fullmatch(pattern, name)]
    if len(rules) != 1:
        raise AssertionError(
            f"{name}: {len(rules)} sharding rules match it (the check needs exactly one; add a "
            "rule from the architecture for a new parameter)"
        )
    found = rules[0](name, shape, s, tp)
    total = sum(block.size for block in found.blocks)
    assert total == (shape[found.dim] if len(shape) else 1), (
        f"{name}: the {found.kind} layout covers {total} rows of dim {found.dim}, the unsharded "
        f"parameter has {tuple(shape)}"
    )
    return found


# ---------------------------------------------------------------------------------------------
# The unsharded tensor each parameter holds, from the checkpoint


#: vLLM 0.34.0's names of RADIO's embedding parameters, and the earlier releases'.
RADIO_EMBEDDINGS = {
    "position_embedding": "pos_embed",
    "patch_projection.": "embedder.",
    "video_patch_projection.": "video_embedder.",
    "cls_register_token": "cls_token.token",
}


def radio_name_before_0_34(name: str) -> str:
    """A RADIO parameter's name in the earlier releases' tree (the checkpoint's, under
    ``model.``), from vLLM 0.34.0's Transformers tree; any other name as it is."""
    if name.startswith("vision_model.encoder.layer."):
        rest = name.removeprefix("vision_model.encoder.layer.").replace(".attention.", ".attn.")
        rest = re.sub(r"\.layer_scale([12])\.lambda1$", r".ls\1", rest)
        return "vision_model.model.encoder.layers." + rest
    if name.startswith("vision_model.embeddings."):
        part = name.removeprefix("vision_model.embeddings.")
        for ours, theirs in RADIO_EMBEDDINGS.items():
            if part.startswith(ours):
                return "vision_model.model.patch_generator." + theirs + part.removeprefix(ours)
    return name


def unsharded(name: str, checkpoint: dict[str, torch.Tensor], s: Sizes) -> torch.Tensor:
    """The checkpoint tensor(s) vLLM's parameter ``name`` holds whole at TP = 1 (fused q/k/v,
    ``A = -exp(A_log)``, the vocabulary padded with zero rows); RADIO's layer scales are
    identity (no checkpoint tensor)."""
    name = radio_name_before_0_34(name)
    if name.startswith("language_model.model."):
        source = "language_model.backbone." + name.removeprefix("language_model.model.")
        source = source.replace(".embed_tokens.", ".embeddings.")
    elif name.startswith("vision_model.model.encoder.layers."):
        rest = name.removeprefix("vision_model.model.encoder.layers.")
        source = "vision_model.radio_model.model.blocks." + rest
    elif name.startswith("vision_model.model."):
        source = "vision_model.radio_model." + name.removeprefix("vision_model.")
    elif name.startswith("sound_encoder.projection."):
        source = "sound_projection." + name.removeprefix("sound_encoder.projection.")
    else:
        source = name
    if re.fullmatch(VISION_LAYER + r"ls[12]", name):
        hidden = checkpoint[source.rsplit(".", 1)[0] + ".norm1.weight"].shape[0]
        return torch.ones(hidden)
    if source.endswith(".mixer.A"):
        return -torch.exp(checkpoint[source + "_log"].float())
    if source.endswith(".qkv_proj.weight"):
        return torch.cat(
            [checkpoint[source.replace("qkv_proj", p)] for p in ("q_proj", "k_proj", "v_proj")]
        )
    tensor = checkpoint[source]
    if source.endswith((".embeddings.weight", "lm_head.weight")):
        padded = math.ceil(s.vocab / VOCAB_PADDING) * VOCAB_PADDING
        rows = torch.zeros((padded, *tensor.shape[1:]), dtype=tensor.dtype)
        rows[: tensor.shape[0]] = tensor
        return rows
    return tensor


def shard(full: torch.Tensor, found: Layout, rank: int, tp: int) -> torch.Tensor:
    """Rank ``rank``'s shard of ``full`` under ``found``."""
    if full.dim() == 0:
        return full
    parts, offset = [], 0
    for block in found.blocks:
        piece = block.size // block.pieces
        index = rank * block.pieces // tp
        parts.append(full.narrow(found.dim, offset + index * piece, piece))
        offset += block.size
    return torch.cat(parts, found.dim)


def reassemble(shards: list[torch.Tensor], found: Layout, tp: int) -> torch.Tensor:
    """The unsharded tensor from every rank's shard; a piece held by several ranks must be
    equal on each."""
    if shards[0].dim() == 0:
        return shards[0]
    widths = [block.size // block.pieces for block in found.blocks]
    per_rank = [torch.split(tensor, widths, found.dim) for tensor in shards]
    blocks = []
    for i, block in enumerate(found.blocks):
        pieces = []
        for index in range(block.pieces):
            holders = [r for r in range(tp) if r * block.pieces // tp == index]
            held = [per_rank[r][i] for r in holders]
            for r, other in zip(holders[1:], held[1:], strict=True):
                assert torch.equal(other, held[0]), (
                    f"block {i} piece {index}: rank {r} differs from rank {holders[0]}"
                )
            pieces.append(held[0])
        blocks.append(torch.cat(pieces, found.dim))
    return torch.cat(blocks, found.dim)


# ---------------------------------------------------------------------------------------------
# The checks

_BUILT: dict[tuple[str, ModelSpec, int], dict[int, dict[str, torch.Tensor]]] = {}


def rank_parameters(target, spec: ModelSpec, tp: int) -> dict[int, dict[str, torch.Tensor]]:
    key = (target.name, spec, tp)
    if key not in _BUILT:
        _BUILT[key] = target.tensor_parallel_shards(spec, tp)
    return _BUILT[key]


def described(tensor: torch.Tensor, expected: torch.Tensor) -> str:
    if tensor.shape != expected.shape:
        return f"shape {tuple(tensor.shape)}, expected {tuple(expected.shape)}"
    diff = (tensor.double() - expected.double()).abs()
    where = tuple(int(i) for i in torch.nonzero(diff)[0]) if bool(diff.any()) else ()
    return f"max |difference| {diff.max().item():.3g}, first at {where}"


@pytest.mark.parametrize("serving", SERVINGS, ids=lambda c: f"tp{c.tensor_parallel_size}")
def test_each_rank_holds_the_shard_the_architecture_implies(target, serving):
    tp = serving.tensor_parallel_size
    ranks = rank_parameters(target, SPEC, tp)
    unsharded_names = sorted(rank_parameters(target, SPEC, 1)[0])
    assert sorted(ranks) == list(range(tp))
    checkpoint, sizes = checkpoint_weights(SPEC), Sizes.of(SPEC)
    wrong, kinds = [], set()
    for rank, parameters in ranks.items():
        assert sorted(parameters) == unsharded_names, f"rank {rank}: parameter names differ"
        for name, tensor in parameters.items():
            full = unsharded(name, checkpoint, sizes)
            found = layout(name, full.shape, sizes, tp)
            kinds.add(found.kind)
            expected = shard(full, found, rank, tp)
            if tensor.shape != expected.shape or not torch.equal(
                tensor.double(), expected.double()
            ):
                wrong.append(f"rank {rank} {name} ({found.kind}): {described(tensor, expected)}")
    assert wrong == [], f"{len(wrong)} shards differ from the architecture's: {wrong[:8]}"
    assert len(kinds) >= 10, f"too few kinds of layout exercised: {sorted(kinds)}"


@pytest.mark.parametrize("serving", SERVINGS, ids=lambda c: f"tp{c.tensor_parallel_size}")
def test_the_ranks_shards_reassemble_the_unsharded_parameters(target, serving):
    tp = serving.tensor_parallel_size
    ranks = rank_parameters(target, SPEC, tp)
    whole_model = rank_parameters(target, SPEC, 1)[0]
    sizes = Sizes.of(SPEC)
    wrong = []
    for name, tensor in whole_model.items():
        found = layout(name, tensor.shape, sizes, tp)
        try:
            together = reassemble([ranks[r][name] for r in range(tp)], found, tp)
        except (AssertionError, RuntimeError) as error:
            wrong.append(f"{name} ({found.kind}): {error}")
            continue
        if together.shape != tensor.shape or not torch.equal(together, tensor):
            wrong.append(f"{name} ({found.kind}): {described(together, tensor)}")
    assert wrong == [], f"{len(wrong)} parameters do not reassemble: {wrong[:8]}"
