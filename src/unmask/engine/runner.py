"""The model runner: a step's forwards over subsets of the running rows, each row at its own
columns and with its own K/V rows. Models return logits and know nothing of rows."""

import torch

from unmask.cache.base import Plan
from unmask.engine.rows import RowState
from unmask.kv.rows import Recorder, RowsKV
from unmask.models.base import DiffusionLM


class ModelRunner:
    def __init__(self, model: DiffusionLM, rows: RowState, shift: int) -> None:
        self.model, self.rows, self.shift = model, rows, shift
        self.device = rows.device
        self.layers = model.config.num_layers
        # a tensor-parallel model returns its vocabulary slice to the engine's sampler
        self.local = {"vocab_local": True} if getattr(model, "tp", None) is not None else {}

    def forward(self, f, plan: Plan, s: torch.Tensor, W: int) -> torch.Tensor:
        """Logits (B, W, V) (a tensor-parallel model: this rank's vocabulary slice) for each row's
        block columns [s, s + W) (W = the widest block; columns past a row's own block are
        padding), for the rows of forward `f` (engine/work.py: its rows and sizes, read with the
        step's shape, so nothing is read back here). A full forward covers each row's
        [0, plan.end) (its canvas, or a block model's prefill), a window forward
        [plan.start, plan.end) against the row's K/V."""
        r, shift, idx = self.rows, self.shift, f.idx
        ar = torch.arange(W, device=self.device)[None, :]
        if f.full:
            lens, Lmax = plan.end[idx], f.width
            ids, pos = r.x[idx, :Lmax], r.pos[idx, :Lmax]
            key_mask = torch.arange(Lmax, device=self.device)[None, :] < lens[:, None] if f.ragged else None
            kv = None
            if f.writes_kv:
                cols = torch.arange(Lmax, device=self.device)[None, :].expand(idx.numel(), -1)
                cols = torch.where(cols < lens[:, None], cols, r.cap)
                kv = RowsKV(r, None if f.all_rows else idx, cols, True, self.layers)
            hidden = (s[idx, None] - shift + ar).clamp(0, Lmax - 1)
            return self.model(ids, pos, kv, 0, key_mask, hidden, **self.local)
        start, end = plan.start, plan.end
        q = f.width  # the widest window
        aq = torch.arange(q, device=self.device)[None, :]
        valid = aq < (end - start)[idx, None]
        cols = torch.where(valid, start[idx, None] + aq, r.cap)
        ids, pos = r.x[idx].gather(1, cols), r.pos[idx].gather(1, cols)
        key_mask = torch.arange(r.cap + 1, device=self.device)[None, :] < r.T[idx, None]
        kv = RowsKV(r, None if f.all_rows else idx, cols, False, self.layers)
        hidden = (ar + (s[idx, None] - shift - start[idx, None])).clamp(0, q - 1)
        return self.model(ids, pos, kv, start[idx], key_mask, hidden, **self.local)  # per-row first query column

    def fresh(self, idx: torch.Tensor, s: torch.Tensor, W: int):
        """For diagnostics: an uncached full forward over the rows' current canvases (nothing is
        written to the KV rows): logits at the block columns, and every layer's fresh K/V."""
        r = self.rows
        Lmax = int(r.T[idx].max())
        key_mask = torch.arange(Lmax, device=self.device)[None, :] < r.T[idx, None]
        key_mask = None if bool(key_mask.all()) else key_mask
        rec = Recorder(Lmax)
        hidden = (s[idx, None] - self.shift + torch.arange(W, device=self.device)[None, :]).clamp(0, Lmax - 1)
        logits = self.model(r.x[idx, :Lmax], r.pos[idx, :Lmax], rec, 0, key_mask, hidden)
        return logits, rec
