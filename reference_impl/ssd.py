"""The Mamba2 selective scan (SSD), twice: the exact sequential recurrence and the chunked form.

Glossary (Mamba2 paper, "Transformers are SSMs", section 6):

    b   batch
    l   sequence length (time steps)
    h   heads                                   (``mamba_num_heads``)
    p   channels per head                       (``mamba_head_dim``; the paper's P)
    g   groups sharing B and C; ``h/g`` heads per group (``n_groups``)
    n   state size                              (``ssm_state_size``; the paper's N)
    c   chunks, ``T`` steps each                (``chunk_size``)

The recurrence, per head, with ``dt > 0`` (after softplus) and ``A < 0``::

    S_t = exp(dt_t * A) * S_{t-1} + dt_t * x_t B_t^T        S: [p, n]
    y_t = S_t C_t + D * x_t

:func:`ssd_sequential` runs it step by step: the oracle, and the decode step. :func:`ssd_chunked`
computes the same in O(l) with matrix products: within a chunk the output is a masked
"attention" ``(C_i . B_j) * exp(a_i - a_j) * dt_j`` over ``j <= i``; across chunks a short
recurrence carries the state (as in state-spaces/mamba's ``ssd_minimal``, with heads split into
``g`` groups of ``r = h/g`` so that ``g > 1`` works).

Everything runs in fp32; outputs are cast back to ``x``'s dtype.
"""

from __future__ import annotations

import torch


def expand_groups(bc: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``[..., g, n]`` to ``[..., h, n]``: head ``i`` uses group ``i // (h/g)``."""
    return bc.repeat_interleave(num_heads // bc.shape[-2], dim=-2)


def ssd_sequential(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact recurrence, one step at a time (in fp32, or fp64 for fp64 inputs).

    Args:
        x: ``[b, l, h, p]``. dt: ``[b, l, h]`` (positive). A: ``[h]`` (negative).
        B, C: ``[b, l, g, n]``. D: ``[h]``. initial_state: ``[b, h, p, n]`` or None (zeros).
    Returns:
        ``y [b, l, h, p]`` and the final state ``[b, h, p, n]`` (fp32).
    """
    b, l, h, p = x.shape
    n = B.shape[-1]
    # fp32 at least; fp64 inputs stay fp64 (the tests' high-precision oracle).
    work = torch.promote_types(x.dtype, torch.float32)
    state = x.new_zeros(b, h, p, n, dtype=work) if initial_state is None else initial_state.to(work)
    x32, dt32, A32, D32 = x.to(work), dt.to(work), A.to(work), D.to(work)
    Bh, Ch = expand_groups(B.to(work), h), expand_groups(C.to(work), h)
    ys = []
    for t in range(l):
        decay = torch.exp(dt32[:, t] * A32)  # [b, h]
        inject = (dt32[:, t, :, None] * x32[:, t])[..., None] * Bh[:, t, :, None, :]
        state = state * decay[..., None, None] + inject  # [b, h, p, n]
        ys.append(torch.einsum("bhpn,bhn->bhp", state, Ch[:, t]) + D32[:, None] * x32[:, t])
    y = torch.stack(ys, dim=1) if ys else x32.new_zeros(b, 0, h, p)
    return y.to(x.dtype), state


def segment_sum(a: torch.Tensor) -> torch.Tensor:
    """``[..., T]`` to ``[..., T, T]`` with ``out[i, j] = a[j+1] + ... + a[i]`` for ``j <= i``
    and ``-inf`` above the diagonal.

    Summed directly rather than as ``cumsum[i] - cumsum[j]``, which loses precision once the
    cumulative decay is large. The sum runs along the last (contiguous) axis of the transposed
    matrix, which is several times faster on CPU than summing down columns.
    """
    t = a.shape[-1]
    ones = torch.ones(t, t, dtype=torch.bool, device=a.device)
    rows = a[..., None, :].expand(*a.shape, t)  # rows[..., j, k] = a[k]
    sums = torch.cumsum(torch.where(torch.triu(ones, diagonal=1), rows, 0.0), dim=-1)
    sums.masked_fill_(~torch.triu(ones), float("-inf"))  # sums[..., j, i]: k in (j, i]
    return sums.transpose(-1, -2)


def ssd_chunked(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    chunk_size: int,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same scan in chunks of ``chunk_size`` steps. Arguments and results as
    :func:`ssd_sequential`.

    Heads are split as ``h = g * r`` (``r`` heads per group), so B and C are used per group,
    never copied per head.
    """
    b, l, h, p = x.shape
    g, n = B.shape[-2:]
    r, t = h // g, chunk_size
    pad = (-l) % t
    c = (l + pad) // t

    def chunks(v: torch.Tensor) -> torch.Tensor:
        """``[b, l, ...]`` in fp32, zero-padded to ``c * t`` steps, as ``[b, c, t, ...]``.
        (dt = 0 on padding: no decay and no input, so the final state is exact.)"""
        v = v.float()
        if pad:
            v = torch.cat([v, v.new_zeros(b, pad, *v.shape[2:])], dim=1)
        return v.reshape(b, c, t, *v.shape[2:])

    x32 = chunks(x).reshape(b, c, t, g, r, p)
    dt32 = chunks(dt).reshape(b, c, t, g, r)
    B32, C32 = chunks(B), chunks(C)  # [b, c, t, g, n]

    a = (dt32 * A.float().reshape(g, r)).permute(0, 1, 3, 4, 2)  # [b, c, g, r, t] log-decay
    a_cum = torch.cumsum(a, dim=-1)
    xdt = x32 * dt32[..., None]  # [b, c, t, g, r, p]

    # 1. Within each chunk: y_i += sum_{j<=i} (C_i . B_j) exp(a_{j+1..i}) dt_j x_j.
    scores = torch.einsum("bcign,bcjgn->bcgij", C32, B32)  # shared by the group's heads
    weights = scores[:, :, :, None] * torch.exp(segment_sum(a))  # [b, c, g, r, t, t]
    y = torch.einsum("bcgrij,bcjgrp->bcigrp", weights, xdt)

    # 2. Each chunk's own contribution to the state at its end.
    decay_to_end = torch.exp(a_cum[..., -1:] - a_cum)  # [b, c, g, r, t]
    chunk_states = torch.einsum("bcgrj,bcjgn,bcjgrp->bcgrpn", decay_to_end, B32, xdt)

    # 3. Carry the state across chunks (c is small: a plain loop reads best).
    state = (
        x32.new_zeros(b, g, r, p, n)
        if initial_state is None
        else initial_state.float().reshape(b, g, r, p, n)
    )
    chunk_decay = torch.exp(a_cum[..., -1])  # [b, c, g, r]
    starts = []
    for k in range(c):
        starts.append(state)
        state = state * chunk_decay[:, k, ..., None, None] + chunk_states[:, k]
    start_states = torch.stack(starts, dim=1)  # [b, c, g, r, p, n]

    # 4. The state entering each chunk, decayed to each step and read out by C.
    y = y + torch.einsum("bcign,bcgrpn,bcgri->bcigrp", C32, start_states, torch.exp(a_cum))
    y = y + D.float().reshape(g, r, 1) * x32
    y = y.reshape(b, c * t, h, p)[:, :l]
    return y.to(x.dtype), state.reshape(b, h, p, n)
