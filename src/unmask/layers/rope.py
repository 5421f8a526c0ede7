"""Non-interleaved ("rotate half") rotary position embedding, computed in float32.

Keys are rotated once, when they are computed, and cached after rotation: a cached key is never
rotated again (the reference LLaDA code re-rotates every cached key on every forward; the result
is the same element-wise computation, so storing rotated keys is exact).
"""

import torch


class RotaryEmbedding:
    """cos/sin for integer positions, computed from the positions of each forward: no table to
    grow and no host sync to size it (the same element-wise float32 ops a table would hold)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        """`head_dim`: the rotated dims of a head (all of it, or its first part: partial rotary,
        whose frequencies are those of a head of that size, as transformers computes them)."""
        if head_dim % 2:
            raise ValueError(f"rotary head_dim must be even, got {head_dim}")
        self.head_dim = head_dim
        # built on the CPU explicitly: models are constructed under torch.device("meta")
        ar = torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu")
        self.inv_freq = 1.0 / (theta ** (ar / head_dim))

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (B, q) int64 -> cos, sin of shape (B, 1, q, head_dim), float32."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions.clamp(min=0).float()[..., None] * self.inv_freq
        table = torch.cat((freqs, freqs), dim=-1)
        return table.cos().unsqueeze(1), table.sin().unsqueeze(1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, q, D) rotated in float32 and cast back to its dtype. When cos covers fewer than
    D dims (partial rotary), only the first cos.shape[-1] dims of each head are rotated."""
    r = cos.shape[-1]
    if r < x.shape[-1]:
        return torch.cat([apply_rotary(x[..., :r], cos, sin), x[..., r:]], dim=-1)
    xf = x.float()
    return (xf * cos + _rotate_half(xf) * sin).to(x.dtype)
