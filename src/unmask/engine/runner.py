"""The model runner: a step's forwards over subsets of the running rows, each row at its own
columns and with its own K/V rows. Models return logits and know nothing of rows."""

import torch

from unmask.cache.base import Plan
from unmask.engine.rows import RowState
from unmask.models.base import DiffusionLM


class RowsKV:
    """The KV buffer interface a model writes through, over a subset of running rows whose query
    windows start at per-row canvas columns. Fresh keys of padded query columns go to the scratch
    column."""

    def __init__(self, rows: RowState, idx: torch.Tensor | None, cols: torch.Tensor, full: bool, num_layers: int) -> None:
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


class ModelRunner:
    def __init__(self, model: DiffusionLM, rows: RowState, shift: int) -> None:
        self.model, self.rows, self.shift = model, rows, shift
        self.device = rows.device
        self.layers = model.config.num_layers
        # a tensor-parallel model returns its vocabulary slice to the engine's sampler
        self.local = {"vocab_local": True} if getattr(model, "tp", None) is not None else {}

    def forward(self, full: bool, idx: torch.Tensor, plan: Plan, s: torch.Tensor, W: int, all_rows: bool) -> torch.Tensor:
        """Logits (B, W, V) (a tensor-parallel model: this rank's vocabulary slice) for each row's block columns [s, s + W) (W = the widest block; columns
        past a row's own block are padding). A full forward covers each row's [0, plan.end) (its
        canvas, or a block model's prefill), a window forward [plan.start, plan.end) against the
        row's K/V. `all_rows`: idx is every running row, in order."""
        r, shift = self.rows, self.shift
        ar = torch.arange(W, device=self.device)[None, :]
        if full:
            lens = plan.end[idx]
            Lmax = int(lens.max())
            ids, pos = r.x[idx, :Lmax], r.pos[idx, :Lmax]
            key_mask = torch.arange(Lmax, device=self.device)[None, :] < lens[:, None]
            key_mask = None if bool(key_mask.all()) else key_mask
            kv = None
            if bool(plan.kv[idx].any()):
                cols = torch.arange(Lmax, device=self.device)[None, :].expand(idx.numel(), -1)
                cols = torch.where(cols < lens[:, None], cols, r.cap)
                kv = RowsKV(r, None if all_rows else idx, cols, True, self.layers)
            hidden = (s[idx, None] - shift + ar).clamp(0, Lmax - 1)
            return self.model(ids, pos, kv, 0, key_mask, hidden, **self.local)
        start, end = plan.start, plan.end
        q = int((end - start)[idx].max())  # the widest window (one small read)
        aq = torch.arange(q, device=self.device)[None, :]
        valid = aq < (end - start)[idx, None]
        cols = torch.where(valid, start[idx, None] + aq, r.cap)
        ids, pos = r.x[idx].gather(1, cols), r.pos[idx].gather(1, cols)
        key_mask = torch.arange(r.cap + 1, device=self.device)[None, :] < r.L[idx, None]
        kv = RowsKV(r, None if all_rows else idx, cols, False, self.layers)
        hidden = (ar + (s[idx, None] - shift - start[idx, None])).clamp(0, q - 1)
        return self.model(ids, pos, kv, start[idx], key_mask, hidden, **self.local)  # per-row first query column

    def fresh(self, idx: torch.Tensor, s: torch.Tensor, W: int):
        """For diagnostics: an uncached full forward over the rows' current canvases (nothing is
        written to the KV rows): logits at the block columns, and every layer's fresh K/V."""
        r = self.rows
        Lmax = int(r.L[idx].max())
        key_mask = torch.arange(Lmax, device=self.device)[None, :] < r.L[idx, None]
        key_mask = None if bool(key_mask.all()) else key_mask
        rec = Recorder(Lmax)
        hidden = (s[idx, None] - self.shift + torch.arange(W, device=self.device)[None, :]).clamp(0, Lmax - 1)
        logits = self.model(r.x[idx, :Lmax], r.pos[idx, :Lmax], rec, 0, key_mask, hidden)
        return logits, rec
