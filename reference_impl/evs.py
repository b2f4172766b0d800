"""EVS: Efficient Video Sampling, pruning a video's temporally static tokens before the merge.

Glossary: ``g`` groups (frames, or tubelets of ``T`` frames when ``T > 1``), ``k`` tokens per
group after the pixel shuffle (a ``rows x cols`` grid), ``h`` the language model's width, ``q``
the pruning rate in ``[0, 1)`` (a serving option: the fraction of a video's tokens dropped).

The method, as the architecture brief describes it:

- a token's *dissimilarity* is ``1 - cos(x[t, j], x[t-1, j])``: how much the embedding at spatial
  position ``j`` changed since the previous group; the first group has no previous one and is
  always kept whole;
- the video keeps ``max(k, floor(g * k * (1 - q)))`` tokens (never fewer than one group's);
- the kept tokens are the most dissimilar ones, ties going to the earlier token in ``(t, j)``
  order, and they stay in that order;
- the processor sizes the video's placeholder for the kept count before any pixel is embedded
  (it cannot know which tokens go), so it puts them all after the first group's separator; the
  model, which does know, rebuilds the replacement with each group's real count. Only the
  total must agree: the model fills every position of the replacement itself.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from reference_impl.errors import ConfigError


def check_rate(rate: float, name: str = "video_pruning_rate") -> None:
    """``rate`` must be a finite float in ``[0, 1)``: at 1 nothing would be kept."""
    is_number = isinstance(rate, int | float) and not isinstance(rate, bool)
    if not (is_number and math.isfinite(rate) and 0.0 <= rate < 1.0):
        raise ConfigError(name, "a float in [0, 1)", rate)


def retained_count(tokens_per_group: int, num_groups: int, rate: float) -> int:
    """Tokens a video of ``num_groups`` groups of ``tokens_per_group`` keeps at ``rate``:
    ``max(k, floor(g * k * (1 - q)))``."""
    check_rate(rate)
    if tokens_per_group < 1 or num_groups < 1:
        raise ConfigError(
            "video", "at least one group of at least one token", (num_groups, tokens_per_group)
        )
    total = tokens_per_group * num_groups
    return max(tokens_per_group, int(total * (1.0 - rate)))


def placeholder_tokens_per_group(tokens_per_group: int, num_groups: int, rate: float) -> list[int]:
    """The context tokens per group the processor puts in a video's placeholder: every token
    of the video at rate 0; with pruning, the retained count after the first group's
    separator and none after the others'."""
    if rate == 0.0:
        return [tokens_per_group] * num_groups
    return [retained_count(tokens_per_group, num_groups, rate)] + [0] * (num_groups - 1)


def dissimilarity(groups: torch.Tensor) -> torch.Tensor:
    """``[g, k, h]`` -> ``[g, k]``: ``1 - cos`` to the same position of the previous group; the
    first group gets ``+inf`` (always kept). Computed in the embeddings' dtype: in bf16 the
    scores round onto a coarse grid, and which equal scores are kept is then the tie rule's."""
    changed = 1.0 - F.cosine_similarity(groups[1:], groups[:-1], dim=-1)
    first = torch.full_like(groups[:1, :, 0], math.inf)
    return torch.cat([first, changed])


def retention_mask(groups: torch.Tensor, rate: float) -> torch.Tensor:
    """``[g, k, h]`` -> ``[g, k]`` bool: the tokens EVS keeps at ``rate``."""
    g, k, _ = groups.shape
    keep = retained_count(k, g, rate)
    score = dissimilarity(groups).flatten()
    # Most dissimilar first; among equals the earlier token (a stable sort of the negation).
    order = torch.sort(-score, stable=True).indices
    mask = torch.zeros(g * k, dtype=torch.bool, device=groups.device)
    mask[order[:keep]] = True
    return mask.view(g, k)


def prune(groups: torch.Tensor, rate: float) -> tuple[torch.Tensor, list[int]]:
    """``[g, k, h]`` -> the kept rows ``[n, h]`` in ``(t, j)`` order and the kept count of each
    group (rate 0: every row, ``k`` per group)."""
    g, k, h = groups.shape
    if rate == 0.0:
        return groups.reshape(g * k, h), [k] * g
    mask = retention_mask(groups, rate)
    return groups[mask], [int(n) for n in mask.sum(dim=1).tolist()]
