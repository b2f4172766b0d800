"""RADIO: the vision tower (a ViT with CPE position embeddings, class and register tokens).

Glossary:

    n   images, tiles or frames            P   patch side (pixels)
    gh, gw  the patch grid of an image     C   width (hidden size)
    s   tokens of one image: skip + gh*gw  k   skip tokens: class tokens + registers
    T   frames per tubelet (video)         G   the position-embedding grid side, cpe_max_size/P

Mirrors vLLM's ``vllm/model_executor/models/radio.py`` (``ViTPatchGenerator``,
``RadioInternVisionModel``). Parameter names follow the checkpoint without its
``vision_model.radio_model.model.`` prefix (``patch_generator.*``, ``blocks.{i}.*``), so
:meth:`RadioVisionModel.load_checkpoint` maps names by stripping it.

Images of different sizes go through one packed sequence with a block-diagonal attention mask
(each image attends to itself only), as vLLM's varlen attention does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from reference_impl.errors import ConfigError

#: Width, depth, heads and MLP width by timm model name (the checkpoint's ``args["model"]``).
RADIO_SIZES: dict[str, tuple[int, int, int, int]] = {
    "vit_small_patch16_224": (384, 12, 6, 1536),
    "vit_base_patch16_224": (768, 12, 12, 3072),
    "vit_large_patch16_224": (1024, 24, 16, 4096),
    "vit_huge_patch16_224": (1280, 32, 16, 5120),
    "vit_so400m_patch16_224": (1152, 27, 16, 4304),  # in vLLM 0.33.0's table, beyond the brief
}


@dataclass(frozen=True)
class RadioConfig:
    """RADIO's shape. Sizes come from :data:`RADIO_SIZES` by ``model_name``; tiny test variants
    override ``hidden_size`` / ``num_layers`` / ``num_heads`` / ``mlp_size`` explicitly."""

    model_name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    mlp_size: int
    image_size: int = 224
    patch_size: int = 16
    qkv_bias: bool = True
    # The blocks' LayerNorm epsilon: RADIO's own (timm's ``args``, 1e-6 unless they set one).
    layer_norm_eps: float = 1e-6
    # ``vision_config.layer_norm_eps``: the epsilon of the connector's vision_final_layernorm
    # (MTP checkpoints), which vLLM reads for that norm only, not for RADIO's blocks.
    final_layernorm_eps: float = 1e-6
    cpe_max_size: int = 2048
    register_multiple: int | None = None
    num_cls_tokens: int = 1
    video_temporal_patch_size: int = 1
    separate_video_embedder: bool = True

    @classmethod
    def from_model_name(cls, model_name: str, **fields: object) -> RadioConfig:
        if model_name not in RADIO_SIZES:
            raise ConfigError(
                "vision_config.args.model", f"one of {sorted(RADIO_SIZES)}", model_name
            )
        hidden, layers, heads, mlp = RADIO_SIZES[model_name]
        base: dict[str, object] = dict(
            model_name=model_name,
            hidden_size=hidden,
            num_layers=layers,
            num_heads=heads,
            mlp_size=mlp,
        )
        return cls(**{**base, **fields})  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                "num_heads", f"a divisor of hidden_size={self.hidden_size}", self.num_heads
            )
        if self.video_temporal_patch_size > 1 and not self.separate_video_embedder:
            raise ConfigError(
                "separate_video_embedder", "True when video_temporal_patch_size > 1", False
            )

    @property
    def num_registers(self) -> int:
        if not self.register_multiple:
            return 0
        return self.register_multiple - self.num_cls_tokens % self.register_multiple

    @property
    def num_skip(self) -> int:
        """Tokens before the patches: class tokens and registers."""
        return self.num_cls_tokens + self.num_registers

    @property
    def pos_grid(self) -> int:
        """``G``: the position-embedding grid side (``cpe_max_size`` rounded to patches)."""
        return round(self.cpe_max_size / self.patch_size)

    def shrunk(self, **fields: object) -> RadioConfig:
        return dataclasses.replace(self, **fields)  # type: ignore[arg-type]


def patchify(images: torch.Tensor, p: int) -> torch.Tensor:
    """``[n, 3, gh*P, gw*P]`` to ``[n, gh*gw, 3*P*P]``: row-major patches, channels outermost
    within a patch (``c yy xx``)."""
    n, c, h, w = images.shape
    x = images.reshape(n, c, h // p, p, w // p, p)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(n, (h // p) * (w // p), c * p * p)


class PatchGenerator(nn.Module):
    """Patches to tokens: linear embedding, CPE position embedding, class + register tokens."""

    def __init__(self, config: RadioConfig) -> None:
        super().__init__()
        self.config = config
        c, p = config.hidden_size, config.patch_size
        self.embedder = nn.Linear(3 * p * p, c, bias=False)
        if config.video_temporal_patch_size > 1:
            self.video_embedder = nn.Linear(
                3 * config.video_temporal_patch_size * p * p, c, bias=False
            )
        self.pos_embed = nn.Parameter(torch.randn(1, config.pos_grid**2, c) * c**-0.5)
        self.cls_token = nn.Parameter(torch.randn(config.num_skip, c) * c**-0.5)

    def position_embedding(self, gh: int, gw: int) -> torch.Tensor:
        """``[gh*gw, C]`` for a ``gh x gw`` grid. CPE (the table is for ``cpe_max_size``
        pixels, larger than ``image_size``): the ``G x G`` table is resized (bilinear) to
        ``max(gh, gw)`` square, then cropped to the top-left ``gh x gw``. Otherwise it is
        cropped, and resized only if still not ``gh x gw``."""
        config, g = self.config, self.config.pos_grid
        if (gh, gw) == (g, g):
            return self.pos_embed[0]
        table = self.pos_embed.reshape(1, g, g, -1).permute(0, 3, 1, 2)
        if g != config.image_size // config.patch_size:  # CPE mode
            side = max(gh, gw)
            table = _resize(table, side, side)
        table = table[..., :gh, :gw]
        if table.shape[-2:] != (gh, gw):
            table = _resize(table, gh, gw)
        return table.flatten(2).transpose(1, 2)[0]

    def with_skip_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[n, gh*gw, C]`` to ``[n, k + gh*gw, C]``."""
        skip = self.cls_token.unsqueeze(0).expand(tokens.shape[0], -1, -1)
        return torch.cat([skip.to(tokens.dtype), tokens], dim=1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``[n, 3, H, W]`` (one size) to ``[n, k + gh*gw, C]``."""
        p = self.config.patch_size
        gh, gw = images.shape[-2] // p, images.shape[-1] // p
        tokens = self.embedder(patchify(images, p).to(self.embedder.weight.dtype))
        return self.with_skip_tokens(tokens + self.position_embedding(gh, gw))

    def forward_video(self, frames: torch.Tensor) -> torch.Tensor:
        """``[v, 3, H, W]`` frames of one video to ``[ceil(v/T), k + gh*gw, C]`` tubelet tokens:
        the frame count is padded to a multiple of ``T`` by repeating the last frame, and each
        spatial position concatenates its ``T`` frames' patches (``T c yy xx``)."""
        t, p = self.config.video_temporal_patch_size, self.config.patch_size
        gh, gw = frames.shape[-2] // p, frames.shape[-1] // p
        patches = patchify(frames, p)  # [v, gh*gw, 3PP]
        pad = (-patches.shape[0]) % t
        if pad:
            patches = torch.cat([patches, patches[-1:].expand(pad, -1, -1)])
        v, s, f = patches.shape
        tubelets = patches.reshape(v // t, t, s, f).transpose(1, 2).reshape(v // t, s, t * f)
        tokens = self.video_embedder(tubelets.to(self.video_embedder.weight.dtype))
        return self.with_skip_tokens(tokens + self.position_embedding(gh, gw))


class Attention(nn.Module):
    """Full (non-causal) multi-head attention: fused ``qkv`` with bias, ``proj``."""

    def __init__(self, config: RadioConfig) -> None:
        super().__init__()
        self.heads = config.num_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.qkv_bias)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x [n, s, C]``; ``mask [s, s]`` (True: may attend) for packed images."""
        n, s, c = x.shape
        q, k, v = (
            t.reshape(n, s, self.heads, c // self.heads).transpose(1, 2)
            for t in self.qkv(x).chunk(3, dim=-1)
        )
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        projected: torch.Tensor = self.proj(out.transpose(1, 2).reshape(n, s, c))
        return projected


class MLP(nn.Module):
    def __init__(self, config: RadioConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.mlp_size)
        self.fc2 = nn.Linear(config.mlp_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc2(F.gelu(self.fc1(x)))
        return out


class Block(nn.Module):
    """Pre-LN: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))`` (layer scales are ones)."""

    def __init__(self, config: RadioConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attn = Attention(config)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), mask)
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class RadioVisionModel(nn.Module):
    """The tower: tokens, the blocks, the features without the skip tokens (no final norm).

    Implements the multimodal wrapper's ``VisionTower`` protocol.
    """

    def __init__(self, config: RadioConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_generator = PatchGenerator(config)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))

    def encode(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        for block in self.blocks:
            tokens = block(tokens, mask)
        return tokens

    def _check(self, images: torch.Tensor, field: str) -> None:
        p = self.config.patch_size
        if images.ndim != 4 or images.shape[1] != 3:
            raise ConfigError(field, "a [n, 3, H, W] tensor", tuple(images.shape))
        if images.shape[-2] % p or images.shape[-1] % p:
            raise ConfigError(
                field, f"H and W multiples of patch_size={p}", tuple(images.shape[-2:])
            )

    def forward_tiles(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``[n, 3, H, W]`` to ``[n, gh*gw, C]``."""
        self._check(pixel_values, "pixel_values")
        out = self.encode(self.patch_generator(pixel_values))
        return out[:, self.config.num_skip :]

    def forward_video(self, frames: torch.Tensor, temporal_patch_size: int) -> torch.Tensor:
        """``[v, 3, H, W]`` frames of one video to ``[ceil(v/T), gh*gw, C]``."""
        self._check(frames, "frames")
        if temporal_patch_size != self.config.video_temporal_patch_size:
            raise ConfigError(
                "temporal_patch_size",
                f"{self.config.video_temporal_patch_size} (the tower's)",
                temporal_patch_size,
            )
        if temporal_patch_size == 1:
            return self.forward_tiles(frames)
        out = self.encode(self.patch_generator.forward_video(frames))
        return out[:, self.config.num_skip :]

    def forward_dynamic(self, images: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Images ``[3, H_i, W_i]`` at their own sizes, packed into one sequence with a
        block-diagonal mask, to ``[gh_i*gw_i, C]`` features each."""
        tokens = []
        for i, image in enumerate(images):
            self._check(image.unsqueeze(0), f"images[{i}]")
            tokens.append(self.patch_generator(image.unsqueeze(0))[0])
        lengths = [t.shape[0] for t in tokens]
        packed = torch.cat(tokens).unsqueeze(0)
        mask = block_diagonal_mask(lengths, packed.device) if len(tokens) > 1 else None
        out = self.encode(packed, mask)[0]
        k = self.config.num_skip
        return [item[k:] for item in torch.split(out, lengths)]

    def load_checkpoint(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Load ``vision_model.radio_model.*`` (or ``radio_model.*``) checkpoint tensors;
        ``summary_idxs``, ``input_conditioner.*`` and the layer scales ``ls1`` / ``ls2`` (ones,
        never loaded) are skipped. Every missing, unexpected or mis-shaped name raises."""
        params = dict(self.named_parameters())
        loaded: dict[str, torch.Tensor] = {}
        unexpected, mis_shaped = [], []
        for name, tensor in weights.items():
            sub = name.removeprefix("vision_model.").removeprefix("radio_model.")
            if sub == "summary_idxs" or sub.startswith("input_conditioner."):
                continue
            sub = sub.removeprefix("model.")
            if sub.endswith((".ls1", ".ls2", ".ls1.gamma", ".ls2.gamma")):
                continue
            sub = sub.replace("patch_generator.cls_token.token", "patch_generator.cls_token")
            if sub not in params:
                unexpected.append(name)
            elif params[sub].shape != tensor.shape:
                mis_shaped.append(
                    f"{name} (expected {tuple(params[sub].shape)}, got {tuple(tensor.shape)})"
                )
            else:
                loaded[sub] = tensor
        missing = sorted(set(params) - set(loaded))
        if missing or unexpected or mis_shaped:
            raise ConfigError(
                "vision weights",
                "every RADIO parameter, nothing else",
                f"missing {missing}, unexpected {unexpected}, mis-shaped {mis_shaped}",
            )
        with torch.no_grad():
            for sub, tensor in loaded.items():
                params[sub].copy_(tensor)


def block_diagonal_mask(lengths: Sequence[int], device: torch.device) -> torch.Tensor:
    """``[s, s]`` bool, True where query and key belong to the same item."""
    owner = torch.repeat_interleave(
        torch.arange(len(lengths), device=device), torch.tensor(list(lengths), device=device)
    )
    return owner[:, None] == owner[None, :]


def _resize(table: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Bilinear (``align_corners=False``) in fp32."""
    out = F.interpolate(table.float(), size=(h, w), mode="bilinear", align_corners=False)
    return out.to(table.dtype)
