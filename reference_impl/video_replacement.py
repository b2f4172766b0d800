"""The tokens one ``<video>`` becomes: frame separators, ``<img>`` / ``</img>`` tags and context
tokens, one group per frame (``T == 1``) or per tubelet of ``T`` frames.

Glossary: ``T`` temporal patch size (frames per tubelet), ``g`` groups of a video (its frames,
or its tubelets when ``T > 1``), ``k`` context tokens of one group.

The processor (:mod:`reference_impl.processor`) puts this replacement into the prompt; the model
(:mod:`reference_impl.model`) rebuilds it to fill the non-context positions with text
embeddings, so both take it from here.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from reference_impl.tokenizer import IMG_CONTEXT, IMG_END, IMG_START


def frame_timestamps(frames_indices: Sequence[int], frame_duration_ms: int) -> list[float]:
    """Seconds at which each frame was sampled: ``index * duration_ms / 1000``."""
    return [int(i) * frame_duration_ms / 1000.0 for i in frames_indices]


def frame_separators(
    num_groups: int,
    frames_indices: Sequence[int],
    frame_duration_ms: int | None,
    temporal_patch_size: int = 1,
) -> list[str]:
    """The ``g`` separator texts, one before each frame (``T == 1``) or tubelet (``T > 1``).

    - ``T == 1``: ``"Frame {i+1} sampled at {ts:.2f} seconds: "``.
    - ``T > 1``: the tubelet's frames joined by ``" and "``, the first ``"Frame ..."``, later ones
      ``"frame ..."``, then ``": "``; frames past the end are not listed.
    - Without a frame duration: ``"Frame {i+1}: "``.

    Every separator after the first starts with a newline.
    """
    if frame_duration_ms is None:
        return [("\n" if i else "") + f"Frame {i + 1}: " for i in range(num_groups)]
    stamps = frame_timestamps(frames_indices, frame_duration_ms)
    t = temporal_patch_size
    if t == 1:
        return [
            ("\n" if i else "") + f"Frame {i + 1} sampled at {ts:.2f} seconds: "
            for i, ts in enumerate(stamps)
        ]
    separators = []
    for group, start in enumerate(range(0, len(stamps), t)):
        parts = [
            f"{'Frame' if k == start else 'frame'} {k + 1} sampled at {stamps[k]:.2f} seconds"
            for k in range(start, min(start + t, len(stamps)))
        ]
        separators.append(("\n" if group else "") + " and ".join(parts) + ": ")
    return separators


def video_replacement_ids(
    tokenizer: PreTrainedTokenizerBase,
    tokens_per_group: Sequence[int],
    frames_indices: Sequence[int],
    frame_duration_ms: int | None,
    temporal_patch_size: int = 1,
) -> list[int]:
    """Token ids replacing one ``<video>``: per group ``sep + <img> + <image>*k + </img>``, with
    ``tokens_per_group`` the ``g`` counts ``k``.

    Separators are tokenised on their own and the tags use their pre-tokenised ids, so the count
    of non-context tokens does not depend on ``tokens_per_group``.
    """
    seps = frame_separators(
        len(tokens_per_group), frames_indices, frame_duration_ms, temporal_patch_size
    )
    if len(seps) != len(tokens_per_group):
        raise ValueError(
            f"tokens_per_group: expected {len(seps)} groups for {len(frames_indices)} frames "
            f"with T={temporal_patch_size}, got {len(tokens_per_group)}"
        )
    start = tokenizer.encode(IMG_START, add_special_tokens=False)
    end = tokenizer.encode(IMG_END, add_special_tokens=False)
    context = tokenizer.encode(IMG_CONTEXT, add_special_tokens=False)
    sep_ids: list[list[int]] = tokenizer(seps, add_special_tokens=False)["input_ids"]
    ids: list[int] = []
    for sep, k in zip(sep_ids, tokens_per_group, strict=True):
        ids += sep + start + context * k + end
    return ids
