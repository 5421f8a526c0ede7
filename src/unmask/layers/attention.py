"""Attention with an optional boolean mask (key padding; causality for the autoregressive twin)
and an optional KV buffer. Without a mask it is fully bidirectional, as diffusion models attend."""

from typing import Protocol

import torch
import torch.nn.functional as F


class KVBuffer(Protocol):
    """The one interface a model uses to read and write a KV cache.

    A model hands every layer's freshly computed keys/values for the query window and receives
    the keys/values to attend over. Shapes: k, v (B, H_kv, q, D), already rotated; the window
    covers canvas columns [start, start + q). The returned tensors span the whole canvas
    (B, H_kv, L, D). Which columns were fresh and which stale is the cache policy's business.
    """

    length: int  # canvas columns the buffer covers

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        ...


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """q (B, H, q, D), k/v (B, H_kv, Lk, D), mask broadcastable to (B, 1, q, Lk), bool, True =
    attend (padding, and causality for autoregressive models), or None: fully bidirectional.
    Grouped-query attention without copying K/V. Returns (B, q, H*D).
    """
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])
    b, h, n, d = out.shape
    return out.transpose(1, 2).reshape(b, n, h * d)
