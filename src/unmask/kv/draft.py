"""The drafter's context cache of one batch that runs in lockstep (the one-request DFlash loop,
unmask.reference.dflash): per layer (B, H_kv, T, D), cropped to the verified length after a
rejection. The engine's speculative rows keep theirs in slots instead (kv/rows.py DraftKV)."""

import torch


class DraftCache:
    """The drafter's KV cache of context positions, per layer (B, H_kv, T, D)."""

    def __init__(self, num_layers: int) -> None:
        self.k: list[torch.Tensor | None] = [None] * num_layers
        self.v: list[torch.Tensor | None] = [None] * num_layers

    @property
    def length(self) -> int:
        return 0 if self.k[0] is None else self.k[0].shape[2]

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor, context: int):
        """k, v (B, H_kv, context + q, D): the new context positions, then the block. Returns the
        keys/values to attend over (cached context, new context, block) and keeps the new context."""
        new_k, new_v = k[:, :, :context], v[:, :, :context]
        if self.k[layer] is not None:
            k, v = torch.cat([self.k[layer], k], dim=2), torch.cat([self.v[layer], v], dim=2)
            new_k, new_v = torch.cat([self.k[layer], new_k], dim=2), torch.cat([self.v[layer], new_v], dim=2)
        self.k[layer], self.v[layer] = new_k, new_v
        return k, v

    def crop(self, length: int) -> None:
        """Keep the first `length` context positions (after a rejection)."""
        for i in range(len(self.k)):
            if self.k[i] is not None:
                self.k[i], self.v[i] = self.k[i][:, :, :length], self.v[i][:, :, :length]
