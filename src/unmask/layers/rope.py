"""Non-interleaved ("rotate half") rotary position embedding, computed in float32.

Keys are rotated once, when they are computed, and cached after rotation: a cached key is never
rotated again (the reference LLaDA code re-rotates every cached key on every forward; the result
is the same element-wise computation, so storing rotated keys is exact).
"""

import torch


class RotaryEmbedding:
    """cos/sin tables for integer positions, grown on demand (Dream declares 131072 positions)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        if head_dim % 2:
            raise ValueError(f"rotary head_dim must be even, got {head_dim}")
        self.head_dim = head_dim
        # built on the CPU explicitly: models are constructed under torch.device("meta")
        ar = torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu")
        self.inv_freq = 1.0 / (theta ** (ar / head_dim))
        self._cos = torch.empty(0, head_dim, device="cpu")
        self._sin = torch.empty(0, head_dim, device="cpu")

    def _grow(self, n: int, device: torch.device) -> None:
        n = max(n, 2 * self._cos.shape[0], 256)
        seq = torch.arange(n, dtype=torch.float32, device=device)
        freqs = torch.outer(seq, self.inv_freq.to(device))
        table = torch.cat((freqs, freqs), dim=-1)
        self._cos, self._sin = table.cos(), table.sin()

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (B, q) int64 -> cos, sin of shape (B, 1, q, head_dim), float32."""
        need = int(positions.max()) + 1 if positions.numel() else 1
        if need > self._cos.shape[0] or self._cos.device != positions.device:
            self._grow(need, positions.device)
        pos = positions.clamp(min=0)
        return self._cos[pos].unsqueeze(1), self._sin[pos].unsqueeze(1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, q, D) rotated in float32 and cast back to its dtype."""
    xf = x.float()
    return (xf * cos + _rotate_half(xf) * sin).to(x.dtype)
