"""Functional pieces of a pre-norm transformer block, shared by the model families.

Model files own the parameters (named exactly as the released checkpoints name them) and call
these functions, so the arithmetic is written once.
"""

import torch
import torch.nn.functional as F
from torch import nn

from unmask.layers.attention import KVBuffer, attend
from unmask.layers.rope import apply_rotary


def self_attention(
    x: torch.Tensor,
    q_proj: nn.Linear,
    k_proj: nn.Linear,
    v_proj: nn.Linear,
    o_proj: nn.Linear,
    n_heads: int,
    n_kv_heads: int,
    rope: tuple[torch.Tensor, torch.Tensor],
    kv: KVBuffer | None,
    layer: int,
    kv_start: int,
    mask: torch.Tensor | None,
    q_norm: nn.Module | None = None,
    k_norm: nn.Module | None = None,
) -> torch.Tensor:
    """x (B, q, d) -> (B, q, d). Keys are rotated before they reach the KV buffer. `q_norm` and
    `k_norm` (Qwen3 / SDAR) normalise each head's queries and keys before the rotation."""
    b, n, _ = x.shape
    q = q_proj(x).view(b, n, n_heads, -1)
    k = k_proj(x).view(b, n, n_kv_heads, -1)
    v = v_proj(x).view(b, n, n_kv_heads, -1)
    return attend_heads(q, k, v, o_proj, rope, kv, layer, kv_start, mask, q_norm, k_norm)


def fused_self_attention(
    x: torch.Tensor,
    qkv_proj: nn.Linear,
    o_proj: nn.Linear,
    n_heads: int,
    n_kv_heads: int,
    rope: tuple[torch.Tensor, torch.Tensor],
    kv: KVBuffer | None,
    layer: int,
    kv_start: int,
    mask: torch.Tensor | None,
    q_norm: nn.Module | None = None,
    k_norm: nn.Module | None = None,
) -> torch.Tensor:
    """self_attention with one fused projection whose output rows are the query heads, then the
    key heads, then the value heads (LLaDA2.x `query_key_value`)."""
    b, n, _ = x.shape
    qkv = qkv_proj(x).view(b, n, n_heads + 2 * n_kv_heads, -1)
    q, k, v = qkv.split([n_heads, n_kv_heads, n_kv_heads], dim=2)
    return attend_heads(q, k, v, o_proj, rope, kv, layer, kv_start, mask, q_norm, k_norm)


def attend_heads(q, k, v, o_proj, rope, kv, layer, kv_start, mask, q_norm=None, k_norm=None) -> torch.Tensor:
    """q (B, n, H, D), k / v (B, n, H_kv, D): optional per-head norms, rotation (of the first
    cos.shape[-1] dims of each head: partial rotary), the KV buffer, attention, output projection."""
    if q_norm is not None:
        q, k = q_norm(q), k_norm(k)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    cos, sin = rope
    q = apply_rotary(q, cos, sin)
    k = apply_rotary(k, cos, sin)
    if kv is not None:
        k, v = kv.update(layer, k, v, kv_start)
    return o_proj(attend(q, k, v, mask))


def swiglu(x: torch.Tensor, gate: nn.Linear, up: nn.Linear, down: nn.Linear) -> torch.Tensor:
    return down(F.silu(gate(x)) * up(x))
