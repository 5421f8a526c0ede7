"""Static KV storage covering the whole canvas, one (B, H_kv, L, D) buffer per layer for K and V.

Keys are stored after RoPE (every canvas column has a fixed position). A forward over canvas
columns [start, start + q) writes its fresh K/V there in place and attends over the full buffer:
prefix mode writes the block and the masked suffix, dual mode only the block, and a refresh
writes everything. Columns not written by this forward are whatever the last writer left.
"""

import torch


class StaticKV:
    def __init__(self, num_layers: int, length: int) -> None:
        self.length = length
        self.k: list[torch.Tensor | None] = [None] * num_layers
        self.v: list[torch.Tensor | None] = [None] * num_layers

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        end = start + k.shape[2]
        if start == 0 and end == self.length:  # refresh: adopt the fresh tensors, no copy
            self.k[layer], self.v[layer] = k, v
        else:
            if self.k[layer] is None:  # first write is partial (autoregressive prefill)
                shape = (*k.shape[:2], self.length, k.shape[3])
                self.k[layer] = k.new_zeros(shape)
                self.v[layer] = v.new_zeros(shape)
            self.k[layer][:, :, start:end] = k
            self.v[layer][:, :, start:end] = v
        return self.k[layer], self.v[layer]

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keep only batch rows `keep` (finished rows leave the batch)."""
        self.k = [None if t is None else t[keep] for t in self.k]
        self.v = [None if t is None else t[keep] for t in self.v]
