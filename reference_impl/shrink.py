"""Minimal-layer configs: a real config shrunk to CPU size with every layer kind it has.

:func:`minimal_text_config` is the hybrid-aware equivalent of vLLM's test helper
``dummy_hf_overrides``: vLLM's generic shrinker sets ``num_hidden_layers=1``, which breaks
NemotronH's invariant ``len(hybrid_override_pattern) == num_hidden_layers``. Here the pattern
itself shrinks: the first layer(s) of every kind the original has are kept, in their order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from reference_impl.config import NemotronHConfig, VLConfig, merge_block_types
from reference_impl.errors import ConfigError


def minimal_pattern(pattern: str, layers_per_kind: int = 1) -> str:
    """The first ``layers_per_kind`` layers of each kind in ``pattern``, in their order.

    ``"M-M-M*-M-M*-E"`` becomes ``"M-*E"``: every kind the original has, nothing more.
    """
    return "".join(pattern[i] for i in kept_layers(pattern, layers_per_kind))


def kept_layers(pattern: str, layers_per_kind: int = 1) -> list[int]:
    """Indices of the layers :func:`minimal_pattern` keeps."""
    if layers_per_kind < 1:
        raise ConfigError("layers_per_kind", "a positive int", layers_per_kind)
    seen: dict[str, int] = {}
    kept = []
    for i, letter in enumerate(pattern):
        if seen.get(letter, 0) < layers_per_kind:
            seen[letter] = seen.get(letter, 0) + 1
            kept.append(i)
    return kept


def _apply_overrides(config: Any, overrides: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Validated field updates for a dataclass config; unknown keys name the config.

    ``num_hidden_layers`` is left out where the config derives it (the language model's, from
    its pattern, checked against the pattern by the caller); a config that has it as a field
    (Parakeet's) takes it like any other."""
    names = {f.name for f in dataclasses.fields(config) if f.init}
    derived = set() if "num_hidden_layers" in names else {"num_hidden_layers"}
    unknown = sorted(set(overrides) - names - derived)
    if unknown:
        raise ConfigError(f"{where} overrides", f"fields of {type(config).__name__}", unknown)
    updates = {k: v for k, v in overrides.items() if k not in derived}
    if isinstance(updates.get("intermediate_size"), list):
        updates["intermediate_size"] = tuple(updates["intermediate_size"])
    return updates


def minimal_text_config(
    config: NemotronHConfig,
    *,
    layers_per_kind: int = 1,
    experts_per_group: int = 2,
    overrides: Mapping[str, Any] | None = None,
) -> NemotronHConfig:
    """A small copy of ``config`` (the original is never modified).

    - the pattern keeps the first ``layers_per_kind`` layers of each kind (and, for a list of
      MLP widths, the widths of the kept MLP layers);
    - MoE keeps ``n_group`` groups of ``experts_per_group`` experts, and at most 2 experts per
      token;
    - then ``overrides`` apply, e.g. vLLM's registry values
      ``{"num_hidden_layers": 2, "hybrid_override_pattern": "M*"}``; ``num_hidden_layers`` must
      agree with the resulting pattern. Every inconsistency raises :class:`ConfigError`.
    """
    overrides = dict(overrides or {})
    # The transformers 5 form of the pattern.
    merge_block_types(overrides, overrides.pop("layers_block_type", None), "text_config.")
    pattern = minimal_pattern(config.hybrid_override_pattern, layers_per_kind)
    widths: int | tuple[int, ...] = config.intermediate_size
    if isinstance(widths, tuple):  # one width per MLP layer: keep the kept layers' widths
        mlps = [i for i, c in enumerate(config.hybrid_override_pattern) if c == "-"]
        kept = kept_layers(config.hybrid_override_pattern, layers_per_kind)
        widths = tuple(widths[mlps.index(i)] for i in kept if i in mlps)
    shrunk: dict[str, Any] = {"hybrid_override_pattern": pattern, "intermediate_size": widths}
    if "E" in config.hybrid_override_pattern:
        experts = experts_per_group * config.n_group
        shrunk.update(
            n_routed_experts=experts,
            num_experts_per_tok=min(
                config.num_experts_per_tok, 2, config.topk_group * experts_per_group
            ),
        )
    updates = _apply_overrides(config, overrides, "text_config")
    if (
        "hybrid_override_pattern" in updates
        and isinstance(widths, tuple)
        and "intermediate_size" not in updates
    ):
        # An explicit pattern decides the MLP count; spread the original's first width.
        count = updates["hybrid_override_pattern"].count("-")
        shrunk["intermediate_size"] = tuple([widths[0] if widths else 1] * count) if count else 1
    result = dataclasses.replace(config, **{**shrunk, **updates})
    layers = overrides.get("num_hidden_layers")
    if layers is not None and layers != result.num_hidden_layers:
        raise ConfigError(
            "text_config.num_hidden_layers",
            f"the length of hybrid_override_pattern {result.hybrid_override_pattern!r} "
            f"({result.num_hidden_layers})",
            layers,
        )
    return result


def minimal_vl_config(
    config: VLConfig,
    *,
    layers_per_kind: int = 1,
    overrides: Mapping[str, Any] | None = None,
) -> VLConfig:
    """A small copy of a multimodal config: the language model shrunk by
    :func:`minimal_text_config`, RADIO and Parakeet cut to one layer each (RADIO by a layer
    override: its model-name table would give the full depth). Nested ``text_config`` /
    ``vision_config`` / ``sound_config`` overrides are applied *to the nested config* (field by
    field, validated), never merged in as plain dicts; other keys override top-level fields.
    The wrapper's copies of nested sizes (hidden size, vision width, patch size, ``T``) follow
    the nested configs."""
    if config.text_config is None:
        raise ConfigError("text_config", "a NemotronHConfig to shrink", None)
    overrides = dict(overrides or {})
    nested: dict[str, Mapping[str, Any]] = {}
    for key in ("text_config", "vision_config", "sound_config"):
        value = overrides.pop(key, {})
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"{key} overrides", "a mapping of field overrides", type(value).__name__
            )
        nested[key] = value
    text = minimal_text_config(
        config.text_config, layers_per_kind=layers_per_kind, overrides=nested["text_config"]
    )
    updates = _apply_overrides(config, overrides, "top-level")
    updates.update(text_config=text, hidden_size=text.hidden_size, vocab_size=text.vocab_size)
    if config.vision_config is not None:
        vision = dataclasses.replace(
            config.vision_config,
            **{
                "num_layers": 1,
                **_apply_overrides(config.vision_config, nested["vision_config"], "vision_config"),
            },
        )
        updates.update(
            vision_config=vision,
            vit_hidden_size=vision.hidden_size,
            patch_size=vision.patch_size,
            video_temporal_patch_size=vision.video_temporal_patch_size,
        )
    elif nested["vision_config"]:
        raise ConfigError("vision_config overrides", "a vision_config to apply them to", None)
    if config.sound_config is not None:
        sound = dataclasses.replace(
            config.sound_config,
            **{
                "num_hidden_layers": 1,
                **_apply_overrides(config.sound_config, nested["sound_config"], "sound_config"),
                "llm_hidden_size": text.hidden_size,
            },
        )
        updates.update(sound_config=sound)
    elif nested["sound_config"]:
        raise ConfigError("sound_config overrides", "a sound_config to apply them to", None)
    return dataclasses.replace(config, **updates)
