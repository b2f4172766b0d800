"""vLLM's Mamba2 Triton kernels against the reference (run on CUDA: ``pytest -m gpu --device
cuda``; on the CPU the small widths run in Triton's interpreter, see :mod:`harness.gpu.kernels`).

Each kernel is called as vLLM's ``MambaMixer2`` calls it, with the launch metadata its Mamba2
metadata builder makes (:func:`~harness.gpu.kernels.chunk_layout`,
:func:`~harness.gpu.kernels.conv_programs`), on a batch that holds every case serving meets: a
one-token prompt, prompts over several chunks, prompts resumed mid-chunk from a cached state
(ragged chunk starts) and on a chunk boundary, and state-cache slots out of order with the null
block (slot ``NULL_BLOCK_ID``, skipped) among them. The oracle is the reference in fp64 on the
same (rounded) inputs: :func:`~reference_impl.ssd.ssd_sequential` for the scans (and
:func:`~reference_impl.ssd.ssd_chunked` for the prefill),
:func:`~reference_impl.layers.causal_conv1d` for the convolution.

Error: ``max |kernel - oracle| / max |oracle|`` over the output (and over the states).
Tolerances, from what each side rounds:

- fp32 in Triton's interpreter: NumPy fp32 throughout; the kernels' chunked sums reorder fp32
  additions of a few hundred terms: bound ``1e-4`` (fp32 unit roundoff is 6e-8).
- fp32 on CUDA: ``tl.dot`` multiplies fp32 operands as TF32 (10-bit mantissa, unit roundoff
  2^-11 ~ 4.9e-4) with fp32 accumulation: a few roundings of that size, bound ``5e-3``.
- bf16: the inputs are rounded once for both sides; the kernels round again where they cast
  (the C.B scores and the output to bf16, unit roundoff 2^-8 ~ 3.9e-3): bound ``2e-2``.

The widths: a small one (every case runs in the interpreter in seconds), and the two presets'
(Nemotron Nano 12B v2 VL: 128 heads x 80, 8 groups, state 128, chunk 128, conv dim 12288;
Nemotron 3 Nano Omni: 64 x 64, 8 groups, state 128, chunk 128, conv dim 6144), on CUDA only
where the interpreter would take minutes (one state update at the 12B widths: 390 s on a 2-core
machine). The convolution's decode update runs the presets in the interpreter too: a few
seconds, and it tiles the 12288 channels across 48 programs as on a GPU.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from harness.gpu.kernels import (
    Kernels,
    chunk_layout,
    conv_programs,
    installed_ops_folder,
    load,
)
from harness.gpu.real_widths import text_config
from reference_impl.config import NemotronHConfig
from reference_impl.layers import causal_conv1d
from reference_impl.ssd import ssd_chunked, ssd_sequential


@dataclass(frozen=True)
class Widths:
    """The Mamba2 sizes a kernel sees (one tensor-parallel rank of the whole layer)."""

    heads: int
    head_dim: int
    groups: int
    state: int
    chunk: int
    conv_kernel: int

    @classmethod
    def of(cls, config: NemotronHConfig) -> Widths:
        return cls(
            config.mamba_num_heads,
            config.mamba_head_dim,
            config.n_groups,
            config.ssm_state_size,
            config.chunk_size,
            config.conv_kernel,
        )

    @property
    def conv_dim(self) -> int:
        return self.heads * self.head_dim + 2 * self.groups * self.state


# Head dim 12 and state 24 are not powers of two: the kernels' masks are exercised as at 80.
SMALL = Widths(heads=4, head_dim=12, groups=2, state=24, chunk=8, conv_kernel=4)
PRESETS = {"12b-v2": Widths.of(text_config("12b-v2")), "omni": Widths.of(text_config("omni"))}
#: The small width everywhere, the presets on CUDA only.
WIDTHS = [pytest.param(SMALL, id="small")] + [
    pytest.param(w, id=name, marks=pytest.mark.gpu) for name, w in PRESETS.items()
]
#: Every width everywhere: for a kernel the interpreter runs at the presets in seconds.
ALL_WIDTHS = [pytest.param(SMALL, id="small")] + [
    pytest.param(w, id=name) for name, w in PRESETS.items()
]
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
#: Where each sequence's state lives in the cache; slot 0 is vLLM's null block (never named by a
#: real sequence), slot 7 stays unused.
SLOTS = (3, 1, 5, 2, 4)
CACHE_SLOTS = 8


def sequences(chunk: int) -> list[tuple[int, int]]:
    """``(new tokens, tokens computed before)`` per sequence of the prefill batch: one token;
    over a chunk, resumed 5 tokens in; over two chunks, fresh; resumed exactly on a chunk
    boundary; 3 tokens crossing a chunk end, resumed one token before it."""
    t = chunk
    return [(1, 0), (t + 3, 5), (2 * t + 5, 0), (t - 1, 2 * t), (3, t - 1)]


def tolerance(dtype: torch.dtype, kernels: Kernels) -> float:
    if dtype == torch.bfloat16:
        return 2e-2
    return 1e-4 if kernels.runs_on == "triton interpreter" else 5e-3


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    scale = expected.double().abs().max().clamp_min(1e-30)
    return float((actual.double() - expected.double()).abs().max() / scale)


def check_errors(
    errors: dict[str, float],
    dtype: torch.dtype,
    kernels: Kernels,
    record_property: pytest.RecordProperty,
) -> None:
    """Record the errors; the largest must be within the tolerance for ``dtype``."""
    record_property("measured", {"max_relative_error": max(errors.values()), **errors})
    bound = tolerance(dtype, kernels)
    assert max(errors.values()) <= bound, f"errors over {bound}: {errors}"


def assert_untouched(cache: torch.Tensor, before: torch.Tensor, written: list[int]) -> None:
    """Every cache slot but ``written`` holds what it held (the null block included)."""
    untouched = [s for s in range(CACHE_SLOTS) if s not in written]
    assert torch.equal(cache[untouched], before[untouched]), f"slots {untouched} changed"


@pytest.fixture(scope="module")
def kernels(device: torch.device) -> Kernels:
    if installed_ops_folder() is None and "VLLM_KERNELS_SOURCE" not in os.environ:
        pytest.skip(
            "vLLM's kernels: no vLLM installed and VLLM_KERNELS_SOURCE not set "
            "(nemotron-vl-gpu-bundle makes a copy to carry)"
        )
    loaded = load(interpret=device.type == "cpu")
    print(loaded.describe())
    return loaded


@dataclass
class ScanInputs:
    """One prefill batch, flattened over tokens as vLLM passes it."""

    x: torch.Tensor  # [L, h, p]
    dt: torch.Tensor  # [L, h], before softplus and bias
    dt_bias: torch.Tensor  # [h]
    A: torch.Tensor  # [h], negative
    B: torch.Tensor  # [L, g, n]
    C: torch.Tensor  # [L, g, n]
    D: torch.Tensor  # [h]


def scan_inputs(w: Widths, length: int, dtype: torch.dtype, device: torch.device) -> ScanInputs:
    """Mamba2's initialisation ranges: ``A = -exp(A_log)``, ``A_log = log U(1, 16)``; ``dt``
    after softplus mostly in [1e-3, 1e-1]."""
    g = torch.Generator().manual_seed(length * 7 + w.heads)

    def normal(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * scale).to(device, dtype)

    return ScanInputs(
        x=normal(length, w.heads, w.head_dim),
        dt=normal(length, w.heads, scale=0.5),
        dt_bias=(torch.rand(w.heads, generator=g) * 4 - 6).to(device),  # softplus ~ 2e-3..0.1
        A=-torch.exp(torch.log(torch.rand(w.heads, generator=g) * 15 + 1)).to(device),
        B=normal(length, w.groups, w.state, scale=w.state**-0.5),
        C=normal(length, w.groups, w.state, scale=w.state**-0.5),
        D=torch.randn(w.heads, generator=g).to(device),
    )


def softplus_dt(inputs: ScanInputs) -> torch.Tensor:
    return F.softplus(inputs.dt.double() + inputs.dt_bias.double())


def int32(values: list[int] | tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("widths", WIDTHS)
def test_chunked_scan_matches_reference(
    kernels: Kernels,
    widths: Widths,
    dtype: torch.dtype,
    device: torch.device,
    record_property: pytest.RecordProperty,
) -> None:
    """``mamba_chunk_scan_combined_varlen`` on the ragged batch: each sequence's outputs and its
    final state (written to its cache slot) equal the reference scans from its initial state."""
    w = widths
    lengths, computed = (list(column) for column in zip(*sequences(w.chunk), strict=True))
    layout = chunk_layout(w.chunk, lengths, computed)
    inputs = scan_inputs(w, sum(lengths), dtype, device)
    g = torch.Generator().manual_seed(1)
    cache = torch.randn(CACHE_SLOTS, w.heads, w.head_dim, w.state, generator=g).to(device)
    # vLLM's mixer: the cached state where the sequence has computed tokens, else zeros.
    resumed = torch.tensor([c > 0 for c in computed], device=device)
    initial = torch.where(resumed[:, None, None, None], cache[list(SLOTS)], 0.0)
    before = cache.clone()
    out = torch.empty_like(inputs.x)
    kernels.mamba_chunk_scan_combined_varlen(
        inputs.x,
        inputs.dt,
        inputs.A,
        inputs.B,
        inputs.C,
        chunk_size=w.chunk,
        cu_seqlens=int32(layout.cu_seqlens, device),
        cu_chunk_seqlens=int32(layout.cu_chunk_seqlens, device),
        last_chunk_indices=int32(layout.last_chunk_indices, device),
        seq_idx=int32(layout.seq_idx, device),
        out=out,
        D=inputs.D,
        dt_bias=inputs.dt_bias,
        initial_states=initial,
        dt_softplus=True,
        state_dtype=cache.dtype,
        final_states_out=cache,
        final_state_indices=int32(SLOTS, device),
    )
    dt = softplus_dt(inputs)
    errors: dict[str, float] = {}
    for i, (start, end) in enumerate(itertools.pairwise(layout.cu_seqlens)):
        args = (
            inputs.x[None, start:end].double(),
            dt[None, start:end],
            inputs.A.double(),
            inputs.B[None, start:end].double(),
            inputs.C[None, start:end].double(),
            inputs.D.double(),
        )
        y, state = ssd_sequential(*args, initial[i : i + 1].double())
        y_chunked, state_chunked = ssd_chunked(
            *(a.float() for a in args), w.chunk, initial[i : i + 1].float()
        )
        errors[f"seq{i} y"] = relative_error(out[start:end], y[0])
        errors[f"seq{i} state"] = relative_error(cache[SLOTS[i]], state[0])
        errors[f"seq{i} y vs chunked"] = relative_error(out[start:end], y_chunked[0])
        errors[f"seq{i} state vs chunked"] = relative_error(cache[SLOTS[i]], state_chunked[0])
    check_errors(errors, dtype, kernels, record_property)
    assert_untouched(cache, before, list(SLOTS))


def ssu_decode(
    kernels: Kernels,
    w: Widths,
    cache: torch.Tensor,
    inputs: ScanInputs,
    slots: torch.Tensor,
) -> torch.Tensor:
    """One decode step as ``MambaMixer2`` calls ``selective_state_update``: per-head A, dt,
    dt_bias and D broadcast over the head dim; the state read and written at ``slots``."""
    p, n = w.head_dim, w.state
    out = torch.empty_like(inputs.x)
    kernels.selective_state_update(
        cache,
        inputs.x,
        inputs.dt[:, :, None].expand(-1, -1, p),
        inputs.A[:, None, None].expand(-1, p, n).float(),
        inputs.B,
        inputs.C,
        inputs.D[:, None].expand(-1, p),
        inputs.dt_bias[:, None].expand(-1, p),
        dt_softplus=True,
        state_batch_indices=slots,
        dst_state_batch_indices=slots,
        out=out,
    )
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("widths", WIDTHS)
def test_state_update_matches_reference(
    kernels: Kernels,
    widths: Widths,
    dtype: torch.dtype,
    device: torch.device,
    record_property: pytest.RecordProperty,
) -> None:
    """``selective_state_update``: one decode step of four sequences, one of them padding (the
    null block): each real one's output and new state equal one step of the reference
    recurrence; the null block and unnamed slots are left alone."""
    w = widths
    slots = [4, kernels.null_block_id, 2, 6]
    inputs = scan_inputs(w, len(slots), dtype, device)
    g = torch.Generator().manual_seed(2)
    cache = torch.randn(CACHE_SLOTS, w.heads, w.head_dim, w.state, generator=g).to(device)
    before = cache.clone()
    out = ssu_decode(kernels, w, cache, inputs, int32(slots, device))
    y, state = ssd_sequential(
        inputs.x[:, None].double(),
        softplus_dt(inputs)[:, None],
        inputs.A.double(),
        inputs.B[:, None].double(),
        inputs.C[:, None].double(),
        inputs.D.double(),
        before[slots].double(),
    )
    real = [i for i, s in enumerate(slots) if s != kernels.null_block_id]
    errors = {
        "y": relative_error(out[real], y[real, 0]),
        "state": relative_error(cache[[slots[i] for i in real]], state[real]),
    }
    check_errors(errors, dtype, kernels, record_property)
    assert_untouched(cache, before, [slots[i] for i in real])


@pytest.mark.parametrize("widths", WIDTHS)
def test_prefill_then_decode_continues_the_recurrence(
    kernels: Kernels, widths: Widths, device: torch.device, record_property: pytest.RecordProperty
) -> None:
    """A prompt prefilled by the chunked kernel, then four tokens decoded by the state update
    from the slot it wrote: the decoded outputs equal the reference recurrence run over prompt
    and tokens together (fp32)."""
    w = widths
    prompt, steps = w.chunk + 3, 4
    inputs = scan_inputs(w, prompt + steps, torch.float32, device)
    cache = torch.zeros(CACHE_SLOTS, w.heads, w.head_dim, w.state, device=device)
    slot = 3
    layout = chunk_layout(w.chunk, [prompt], [0])

    def rows(t: torch.Tensor, start: int, end: int) -> torch.Tensor:
        return t[start:end] if t.dim() > 1 and t.shape[0] == prompt + steps else t

    def part(start: int, end: int) -> ScanInputs:
        return ScanInputs(**{k: rows(v, start, end) for k, v in vars(inputs).items()})

    first = part(0, prompt)
    kernels.mamba_chunk_scan_combined_varlen(
        first.x,
        first.dt,
        first.A,
        first.B,
        first.C,
        chunk_size=w.chunk,
        cu_seqlens=int32(layout.cu_seqlens, device),
        cu_chunk_seqlens=int32(layout.cu_chunk_seqlens, device),
        last_chunk_indices=int32(layout.last_chunk_indices, device),
        seq_idx=int32(layout.seq_idx, device),
        out=torch.empty_like(first.x),
        D=first.D,
        dt_bias=first.dt_bias,
        dt_softplus=True,
        state_dtype=cache.dtype,
        final_states_out=cache,
        final_state_indices=int32([slot], device),
    )
    decoded = [
        ssu_decode(kernels, w, cache, part(t, t + 1), int32([slot], device))
        for t in range(prompt, prompt + steps)
    ]
    y, _ = ssd_sequential(
        inputs.x[None].double(),
        softplus_dt(inputs)[None],
        inputs.A.double(),
        inputs.B[None].double(),
        inputs.C[None].double(),
        inputs.D.double(),
    )
    errors = {"decoded y": relative_error(torch.cat(decoded), y[0, prompt:])}
    check_errors(errors, torch.float32, kernels, record_property)


#: ``(new tokens, resumes from a cached window)`` per sequence of the convolution batch: one
#: token resumed, 9 fresh (two program blocks), 20 resumed, exactly one block fresh.
CONV_SEQUENCES = ((1, True), (9, False), (20, True), (8, False))
CONV_SLOTS = (1, 3, 2, 5)


def conv_cache(w: Widths, layout: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The conv state cache as the mixer sees it, ``[slots, D, K-1]``: stored that way
    (``DS``) or as ``[slots, K-1, D]`` and transposed (``SD``, channels contiguous)."""
    g = torch.Generator().manual_seed(3)
    shape = (CACHE_SLOTS, w.conv_dim, w.conv_kernel - 1)
    if layout == "DS":
        return torch.randn(*shape, generator=g).to(device, dtype)
    stored = torch.randn(CACHE_SLOTS, w.conv_kernel - 1, w.conv_dim, generator=g)
    return stored.to(device, dtype).transpose(-1, -2)


def conv_weights(w: Widths, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(4)
    weight = torch.randn(w.conv_dim, w.conv_kernel, generator=g) * w.conv_kernel**-0.5
    return weight.to(device), torch.randn(w.conv_dim, generator=g).to(device)


@pytest.mark.parametrize("layout", ["SD", "DS"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("widths", WIDTHS)
def test_causal_conv_prefill_matches_reference(
    kernels: Kernels,
    widths: Widths,
    dtype: torch.dtype,
    layout: str,
    device: torch.device,
    record_property: pytest.RecordProperty,
) -> None:
    """``causal_conv1d_fn`` on a ragged batch, some sequences resuming from their cached
    window: each output equals the reference convolution from that window (zeros when fresh),
    and each sequence's slot then holds its last ``K-1`` inputs."""
    w = widths
    lengths = [n for n, _ in CONV_SEQUENCES]
    starts = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    query_start_loc = int32(starts, device)
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(starts[-1], w.conv_dim, generator=g).to(device, dtype)  # [L, D]
    weight, bias = conv_weights(w, device)
    cache = conv_cache(w, layout, device, dtype)
    before = cache.clone()
    out = kernels.causal_conv1d_fn(
        hidden.transpose(0, 1),  # [D, L], channels contiguous, as the mixer passes it
        weight,
        bias,
        conv_states=cache,
        query_start_loc=query_start_loc,
        cache_indices=int32(CONV_SLOTS, device),
        has_initial_state=torch.tensor([r for _, r in CONV_SEQUENCES], device=device),
        activation="silu",
        metadata=conv_programs(query_start_loc, kernels.pad_slot_id),
    ).transpose(0, 1)
    errors: dict[str, float] = {}
    for i, (start, end) in enumerate(itertools.pairwise(starts)):
        window = before[CONV_SLOTS[i]][None].double() if CONV_SEQUENCES[i][1] else None
        inputs = hidden[start:end].T[None].double()
        expected = causal_conv1d(inputs, weight.double(), bias.double(), window)
        errors[f"seq{i}"] = relative_error(out[start:end], expected[0].T)
        previous = window if window is not None else inputs.new_zeros(1, w.conv_dim, w.conv_kernel)
        tail = torch.cat([previous, inputs], dim=-1)[0, :, -(w.conv_kernel - 1) :]
        assert torch.equal(cache[CONV_SLOTS[i]].double(), tail), f"sequence {i}'s cached window"
    check_errors(errors, dtype, kernels, record_property)
    assert_untouched(cache, before, list(CONV_SLOTS))


@pytest.mark.parametrize("layout", ["SD", "DS"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("widths", ALL_WIDTHS)
def test_causal_conv_update_matches_reference(
    kernels: Kernels,
    widths: Widths,
    dtype: torch.dtype,
    layout: str,
    device: torch.device,
    record_property: pytest.RecordProperty,
) -> None:
    """``causal_conv1d_update``: one decode token for three sequences, one of them padding (the
    null block): each real output equals the reference convolution over its cached window, the
    window shifts by the token, and the null block is left alone."""
    w = widths
    slots = [4, kernels.null_block_id, 2]
    g = torch.Generator().manual_seed(6)
    hidden = torch.randn(len(slots), w.conv_dim, generator=g).to(device, dtype)
    weight, bias = conv_weights(w, device)
    cache = conv_cache(w, layout, device, dtype)
    before = cache.clone()
    out = kernels.causal_conv1d_update(
        hidden.clone(),  # written in place
        cache,
        weight,
        bias,
        "silu",
        conv_state_indices=int32(slots, device),
    )
    errors: dict[str, float] = {}
    for i, slot in enumerate(slots):
        if slot == kernels.null_block_id:
            continue
        window = before[slot][None].double()
        token = hidden[i][None, :, None].double()
        expected = causal_conv1d(token, weight.double(), bias.double(), window)
        errors[f"seq{i}"] = relative_error(out[i], expected[0, :, 0])
        shifted = torch.cat([window, token], dim=-1)[0, :, 1:]
        assert torch.equal(cache[slot].double(), shifted), f"sequence {i}'s window"
    check_errors(errors, dtype, kernels, record_property)
    assert_untouched(cache, before, [s for s in slots if s != kernels.null_block_id])
