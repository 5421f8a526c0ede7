"""K/V views over the engine's running rows (engine/rows.py): each row's K/V live in a slot of
the rows' store, (n, H_kv, cap + 1, D) per layer, allocated by the first forward that writes one
(`rows.layer_buffers`). `rows` is duck-typed: `n`, `cap`, `layer_buffers(name, layers, like)` and
the per-layer lists it returns."""

import torch


class RowsKV:
    """The KV buffer interface a model writes through, over a subset of running rows whose query
    windows start at per-row canvas columns. Fresh keys of padded query columns go to the scratch
    column."""

    def __init__(self, rows, idx: torch.Tensor | None, cols: torch.Tensor, full: bool, num_layers: int) -> None:
        """idx: the rows in the forward, or None for all running rows in order."""
        self.rows, self.idx, self.cols, self.full, self.num_layers = rows, idx, cols, full, num_layers
        self.length = cols.shape[1] if full else rows.cap + 1  # the keys attended over

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int):
        r = self.rows
        r.layer_buffers("k", self.num_layers, k)  # the first cached forward allocates the K/V slots
        r.layer_buffers("v", self.num_layers, v)
        where = self.cols[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
        if self.idx is None:  # every running row: write in place
            kk, vv = r.k[layer].scatter_(2, where, k), r.v[layer].scatter_(2, where, v)
        else:
            kk, vv = r.k[layer][self.idx].scatter_(2, where, k), r.v[layer][self.idx].scatter_(2, where, v)
            r.k[layer][self.idx], r.v[layer][self.idx] = kk, vv
        return (k, v) if self.full else (kk, vv)


class Recorder:
    """A KV buffer that keeps each layer's fresh keys and values and caches nothing."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int):
        self.k[layer], self.v[layer] = k, v
        return k, v


class DraftKV:
    """The drafter's context cache over rows `idx` (None: every running row): per layer
    (n, H_kv, cap + 1, D); the new context of row r goes to columns [dlen_r, dlen_r + count_r),
    its padding to the scratch column."""

    def __init__(self, rows, cols: torch.Tensor, idx: torch.Tensor | None) -> None:
        self.rows, self.cols, self.idx = rows, cols, idx

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor, context: int):
        r, c = self.rows, context
        dk, dv = r.layer_buffers("dk", r.draft_layers, k), r.layer_buffers("dv", r.draft_layers, v)
        where = self.cols[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
        if self.idx is None:
            kk, vv = dk[layer].scatter_(2, where, k[:, :, :c]), dv[layer].scatter_(2, where, v[:, :, :c])
        else:
            kk = dk[layer][self.idx].scatter_(2, where, k[:, :, :c])
            vv = dv[layer][self.idx].scatter_(2, where, v[:, :, :c])
            dk[layer][self.idx], dv[layer][self.idx] = kk, vv
        return torch.cat([kk, k[:, :, c:]], 2), torch.cat([vv, v[:, :, c:]], 2)
