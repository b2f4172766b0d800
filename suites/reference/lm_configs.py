"""Small NemotronH configs for the reference's own tests."""

from __future__ import annotations

from reference_impl.config import NemotronHConfig


def tiny(pattern: str = "M*-E", **fields: object) -> NemotronHConfig:
    base: dict[str, object] = dict(
        vocab_size=97,
        hidden_size=32,
        hybrid_override_pattern=pattern,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        mamba_num_heads=4,
        mamba_head_dim=8,
        n_groups=2,
        ssm_state_size=8,
        chunk_size=8,
        intermediate_size=48,
        n_routed_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        moe_shared_expert_intermediate_size=24,
        n_group=2,
        topk_group=1,
        routed_scaling_factor=1.5,
    )
    base.update(fields)
    return NemotronHConfig(**base)  # type: ignore[arg-type]
