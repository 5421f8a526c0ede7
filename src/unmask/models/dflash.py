"""The DFlash drafter (z-lab, 2026: "Block Diffusion for Flash Speculative Decoding"), in its
released layout (`DFlashDraftModel`, model_type "qwen3", z-lab/dflash `dflash/model.py`).

A small block-diffusion network that drafts a whole block for an autoregressive target in one
forward. It has no embedding and no head of its own: the noise block `[last verified token,
MASK x (B - 1)]` is embedded with the target's embedding and its hidden states go through the
target's head. What it reads of the target: the hidden states of a few target layers
(`target_layer_ids`, by default `build_target_layer_ids`), concatenated, projected (`fc`) and
normalised (`hidden_norm`): the *context*. In every drafter layer the queries come from the noise
block, and the keys and values from the context and the noise block together (the context is not
passed through the layer's input norm; keys are RMS-normalised per head, values are not), rotated
at their positions; attention is bidirectional (no mask). The drafter keeps its own KV cache of
the context positions (cropped to the verified length after each block).

Parameter names equal the released keys: fc, hidden_norm, norm, layers.{i}.{input_layernorm,
post_attention_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, mlp.{gate,up,down}_proj}.
Returns hidden states only; speculative decoding itself is the engine's.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from unmask.errors import CheckpointError
from unmask.layers.norm import RMSNorm
from unmask.layers.rope import RotaryEmbedding, apply_rotary
from unmask.models.base import cfg_flag, cfg_float, cfg_int
from unmask.models.qwen import GatedMLP

ARCHITECTURES = ("DFlashDraftModel",)


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The released rule: one target layer per drafter layer, spread from layer 1 to L - 3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [int(round(start + i * (end - start) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


@dataclass(frozen=True)
class DraftConfig:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float
    rope_theta: float
    attention_bias: bool
    block_size: int
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int | None


def dflash_config(cfg: dict) -> DraftConfig:
    """config.json of a DFlash drafter -> DraftConfig, or a CheckpointError naming the field."""
    F_ = "DFlash"
    archs = cfg.get("architectures") or []
    if not any(a in ARCHITECTURES for a in archs):
        raise CheckpointError(f"config.json: architectures {archs!r} is not a DFlash drafter ({ARCHITECTURES[0]})")
    if cfg.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"config.json: unsupported DFlash option hidden_act={cfg['hidden_act']!r}")
    kinds = cfg.get("layer_types") or []
    if any(k != "full_attention" for k in kinds) or cfg_flag(cfg, "use_sliding_window", False):
        raise CheckpointError(f"config.json: unsupported DFlash option layer_types={kinds!r} (sliding-window "
                              "drafter layers are not supported)")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(rope, dict) or rope.get("rope_type", rope.get("type", "default")) != "default":
        raise CheckpointError(f"config.json: unsupported DFlash rope {rope!r} (supported: the default rotary)")
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    heads = cfg_int(cfg, "num_attention_heads", family=F_)
    hidden = cfg_int(cfg, "hidden_size", family=F_)
    layers = cfg_int(cfg, "num_hidden_layers", family=F_)
    extra = cfg.get("dflash_config") or {}
    if not isinstance(extra, dict):
        raise CheckpointError(f"config.json: dflash_config {extra!r} must be an object")
    targets = cfg_int(cfg, "num_target_layers", family=F_)
    ids = extra.get("target_layer_ids", build_target_layer_ids(targets, layers))
    if (not isinstance(ids, list) or not ids or any(not isinstance(i, int) or isinstance(i, bool) for i in ids)
            or any(not 0 <= i < targets for i in ids)):
        raise CheckpointError(f"config.json: dflash_config.target_layer_ids {ids!r} must list layers of the "
                              f"{targets}-layer target")
    mask = extra.get("mask_token_id")
    if mask is not None and (not isinstance(mask, int) or isinstance(mask, bool) or mask < 0):
        raise CheckpointError(f"config.json: dflash_config.mask_token_id {mask!r} must be a token id")
    block = cfg_int(cfg, "block_size", family=F_)
    if block < 2:
        raise CheckpointError(f"config.json: block_size {block} must be at least 2 (the verified token and a draft)")
    out = DraftConfig(hidden, layers, heads, cfg_int(cfg, "num_key_value_heads", heads),
                      cfg_int(cfg, "head_dim", 0) or hidden // heads, cfg_int(cfg, "intermediate_size", family=F_),
                      cfg_float(cfg, "rms_norm_eps", 1e-6), float(theta), cfg_flag(cfg, "attention_bias", False),
                      block, targets, tuple(ids), mask)
    if out.num_heads % out.num_kv_heads:
        raise CheckpointError(f"config.json: {heads} attention heads are not a multiple of the "
                              f"{out.num_kv_heads} key/value heads")
    return out


def check_pair(c: DraftConfig, target, where: str = "drafter") -> None:
    """Whether drafter config `c` fits `target` (an ArchConfig), or a CheckpointError naming the field."""
    if not target.causal:
        raise CheckpointError(f"{where}: a DFlash drafter drafts for an autoregressive target; this "
                              f"{target.family} model is a diffusion model")
    if c.hidden_size != target.hidden_size:
        raise CheckpointError(f"{where}: hidden_size {c.hidden_size} is not the target's {target.hidden_size} (a "
                              "drafter reads its target's hidden states and uses its embedding and head)")
    if c.num_target_layers != target.num_layers:
        raise CheckpointError(f"{where}: num_target_layers {c.num_target_layers} is not the target's "
                              f"{target.num_layers} layers (this drafter was trained for another model)")
    if c.mask_token_id is not None and not 0 <= c.mask_token_id < target.vocab_size:
        raise CheckpointError(f"{where}: dflash_config.mask_token_id {c.mask_token_id} is outside the target's "
                              f"vocabulary [0, {target.vocab_size})")


class _Attention(nn.Module):
    def __init__(self, c: DraftConfig) -> None:
        super().__init__()
        d, hd = c.hidden_size, c.head_dim
        self.q_proj = nn.Linear(d, c.num_heads * hd, bias=c.attention_bias)
        self.k_proj = nn.Linear(d, c.num_kv_heads * hd, bias=c.attention_bias)
        self.v_proj = nn.Linear(d, c.num_kv_heads * hd, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.num_heads * hd, d, bias=c.attention_bias)
        self.q_norm = RMSNorm(hd, c.norm_eps)
        self.k_norm = RMSNorm(hd, c.norm_eps)
        self.hd = hd


class _Layer(nn.Module):
    def __init__(self, c: DraftConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.norm_eps)
        self.self_attn = _Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.norm_eps)
        self.mlp = GatedMLP(c.hidden_size, c.intermediate_size)


class DFlashDrafter(nn.Module):
    """forward(noise (B, q, d) embedded noise block, context (B, c, n * d) target hidden states of
    the c positions not yet in `cache`, positions (B, c + q) of those context positions then the
    block, cache: a DraftCache or None, mask) -> hidden states (B, q, d) of the block (the caller
    applies the target's head). The context's keys and values are appended to `cache`; the
    block's are not kept."""

    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        self.config = c = config
        self.layers = nn.ModuleList(_Layer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.norm_eps)
        self.fc = nn.Linear(len(c.target_layer_ids) * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.norm_eps)
        self.rope = RotaryEmbedding(c.head_dim, c.rope_theta)

    def forward(self, noise: torch.Tensor, context: torch.Tensor, positions: torch.Tensor,
                cache=None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """`cache`: a context cache with `extend(layer, k, v, context)` (unmask.kv), or None.
        `mask` (B, 1, q, keys) bool, True = attend, over the keys (cached context, context, noise):
        training puts many blocks in one forward, each seeing only the context before its anchor
        and itself; None (decoding): every query sees every key."""
        c = self.config
        b, q, _ = noise.shape
        n = context.shape[1]
        ctx = self.hidden_norm(self.fc(context))
        cos, sin = self.rope(positions)
        x = noise
        for i, layer in enumerate(self.layers):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            qh = a.q_norm(a.q_proj(h).view(b, q, c.num_heads, c.head_dim)).transpose(1, 2)
            both = torch.cat([ctx, h], dim=1)
            k = a.k_norm(a.k_proj(both).view(b, n + q, c.num_kv_heads, c.head_dim)).transpose(1, 2)
            v = a.v_proj(both).view(b, n + q, c.num_kv_heads, c.head_dim).transpose(1, 2)
            qh = apply_rotary(qh, cos[:, :, n:], sin[:, :, n:])
            k = apply_rotary(k, cos, sin)
            if cache is not None:
                k, v = cache.extend(i, k, v, n)
            o = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, enable_gqa=c.num_heads != c.num_kv_heads)
            x = x + a.o_proj(o.transpose(1, 2).reshape(b, q, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x)
