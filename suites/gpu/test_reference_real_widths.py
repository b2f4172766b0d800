"""The reference's layers at the published widths in bf16 on CUDA against fp32 on the CPU (run:
``pytest -m gpu --device cuda``).

One block of each kind of each preset (:func:`harness.gpu.real_widths.layer_cases`: 12B v2 mamba,
attention, MLP; Omni mamba, MoE, attention), same weights on both sides. Prefill: 2 sequences of
:data:`PREFILL` tokens (two SSD chunks); then, for the layers with state, one decode step from
the cache the prefill filled. Compared: the mixer's output ``mixer(norm(x))`` (the residual would
hide its error under the input's own size).

Error: relative Frobenius ``||bf16 - fp32|| / ||fp32||``; bound :data:`BOUND`. bf16 keeps 8
significant bits (unit roundoff u = 2^-8 ~ 3.9e-3). The layer rounds its input, its weights and
each intermediate it hands to the next matmul (norm output, projections, conv, gate, output)
about six times in sequence; matmuls accumulate in fp32 and the scan runs in fp32 (the
reference's rule), so each rounding adds an independent relative error of RMS about u/sqrt(3)
~ 2.3e-3, about sqrt(6) x 2.3e-3 ~ 5.5e-3 in all. The bound, 2e-2, leaves 3.5x headroom; a
wrong cast, a lost fp32 accumulation or a kernel bug moves the output by its own size.

MoE: bf16 can change which experts a token picks when two scores are close, and then the token's
output legitimately differs. So the routing is compared first (each token's expert set in bf16
against fp32: at least :data:`ROUTING_AGREEMENT` of tokens agree), and the error is measured on
the tokens that picked the same experts.
"""

from __future__ import annotations

import copy

import pytest
import torch

from harness.gpu.real_widths import STATEFUL, LayerCase, build_block, hidden_states, layer_cases
from reference_impl.nemotron_h import Block, MoE

pytestmark = pytest.mark.gpu

PREFILL = 256
BATCH = 2
BOUND = 2e-2
ROUTING_AGREEMENT = 0.9


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    difference = actual.double().cpu() - expected.double().cpu()
    return float(difference.norm() / expected.double().cpu().norm())


def expert_sets(block: Block, hidden: torch.Tensor) -> torch.Tensor:
    """Each token's chosen experts, sorted: ``[T, top_k]``."""
    assert isinstance(block.mixer, MoE)
    tokens = block.norm(hidden).reshape(-1, hidden.shape[-1])
    return block.mixer.gate(tokens)[1].sort(dim=-1).values.cpu()


@pytest.mark.parametrize("case", layer_cases(), ids=lambda case: case.id)
def test_bf16_cuda_layer_matches_fp32_cpu(
    case: LayerCase, device: torch.device, record_property: pytest.RecordProperty
) -> None:
    cpu = torch.device("cpu")
    reference = build_block(case)
    fast = copy.deepcopy(reference).to(device, torch.bfloat16)
    x = hidden_states(case, BATCH, PREFILL)
    capacity = PREFILL + 1
    measured: dict[str, float] = {}
    with torch.no_grad():
        cache = reference.mixer.new_cache(BATCH, capacity, cpu, torch.float32)
        fast_cache = fast.mixer.new_cache(BATCH, capacity, device, torch.bfloat16)
        expected = reference.mixer(reference.norm(x), cache)
        actual = fast.mixer(fast.norm(x.to(device, torch.bfloat16)), fast_cache).float()
        rows = torch.ones(BATCH * PREFILL, dtype=torch.bool)
        if case.kind == "moe":
            same = (
                expert_sets(reference, x) == expert_sets(fast, x.to(device, torch.bfloat16))
            ).all(-1)
            measured["routing agreement"] = float(same.float().mean())
            rows = same
        flat = (t.reshape(BATCH * PREFILL, -1) for t in (actual.cpu(), expected))
        measured["prefill"] = relative_error(*(t[rows] for t in flat))
        if case.kind in STATEFUL:
            token = hidden_states(case, BATCH, 1, seed=2)
            positions = torch.full((BATCH,), PREFILL)
            expected_step = reference.mixer(reference.norm(token), cache, positions=positions)
            actual_step = fast.mixer(
                fast.norm(token.to(device, torch.bfloat16)),
                fast_cache,
                positions=positions.to(device),
            )
            measured["decode"] = relative_error(actual_step.float(), expected_step)
    record_property("measured", measured)
    print(f"{case.id}: {measured}")
    if "routing agreement" in measured:
        assert measured["routing agreement"] >= ROUTING_AGREEMENT, measured
    errors = {k: v for k, v in measured.items() if k != "routing agreement"}
    assert max(errors.values()) <= BOUND, f"over {BOUND}: {measured}"
