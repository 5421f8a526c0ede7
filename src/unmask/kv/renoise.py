"""The encoder's KV cache of a renoising model (DiffusionGemma), per row.

The encoder writes *slots* (one per token it encodes: prompt tokens, padding, finished canvases);
the denoiser only reads them. Full-attention layers hold every slot a row wrote; sliding-window
layers hold the row's last `window - 1` slots, as transformers' dynamic cache holds them (so the
denoiser's sliding layers see exactly those). Each held slot has a position (for the encoder's
causal and sliding rules) and a validity: a padding slot is held (it counts towards the window)
but never attended to. Rows are independent: each has its own slot count, so one cache serves a
reference batch (equal counts, left padding invalid) and the engine's rows (each its own prompt,
joining and leaving at any step). Held slots are left-aligned in each row; columns past a row's
held slots are neither held nor valid.

Tensors: K/V per layer (B, H_kv, T, D); per layer kind (sliding or full) positions (B, T) and
held / valid (B, T), shared by the layers of that kind.
"""

from contextlib import contextmanager

import torch


class RenoiseKV:
    def __init__(self, sliding: tuple[bool, ...], window: int, batch: int, device) -> None:
        self.sliding, self.window, self.device = tuple(sliding), window, device
        self.kinds = sorted(set(self.sliding))
        self.k: list[torch.Tensor | None] = [None] * len(sliding)
        self.v: list[torch.Tensor | None] = [None] * len(sliding)
        self.pos = {s: torch.zeros(batch, 0, dtype=torch.long, device=device) for s in self.kinds}
        self.held = {s: torch.zeros(batch, 0, dtype=torch.bool, device=device) for s in self.kinds}
        self.valid = {s: torch.zeros(batch, 0, dtype=torch.bool, device=device) for s in self.kinds}
        self._write = None  # while writing: per kind (mask, order, width, pos, held, valid)
        # while the held slots do not change (between encoder passes, not training): per layer the
        # denoiser's (keys, values, mask) buffers, held K/V then the canvas's, rewritten in place
        self._den: dict[int, tuple] = {}

    @property
    def batch(self) -> int:
        return next(iter(self.pos.values())).shape[0]

    # --- the model's side ------------------------------------------------------------------------
    def encoder_keys(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """New slots' K/V (B, H, n, D) -> (keys, values, mask (B, 1, n, T)) to attend over; the
        layer's held K/V become the old ones and the new ones, truncated as the layer keeps them."""
        mask, order, width = self._write[self.sliding[layer]][:3]
        keys = k if self.k[layer] is None else torch.cat([self.k[layer], k], 2)
        vals = v if self.v[layer] is None else torch.cat([self.v[layer], v], 2)
        idx = order[:, None, :width, None].expand(-1, keys.shape[1], -1, keys.shape[3])
        self.k[layer], self.v[layer] = keys.gather(2, idx), vals.gather(2, idx)
        return keys, vals, mask

    def denoiser_keys(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """The canvas's K/V (B, H, L, D) -> (keys, values, mask or None): the held slots and the
        canvas, bidirectionally (padding masked)."""
        if self.k[layer] is None:
            return k, v, None
        held = self.k[layer].shape[2]
        buf = self._den.get(layer)
        if buf is not None and buf[0].shape == (k.shape[0], k.shape[1], held + k.shape[2], k.shape[3]):
            keys, vals, mask = buf  # the held part is as the last step left it: only the canvas is new
            keys[:, :, held:], vals[:, :, held:] = k, v
            return keys, vals, mask
        keys, vals = torch.cat([self.k[layer], k], 2), torch.cat([self.v[layer], v], 2)
        valid = self.valid[self.sliding[layer]]
        mask = None
        if not bool(valid.all()):
            mask = torch.cat([valid, valid.new_ones(valid.shape[0], k.shape[2])], 1)[:, None, None, :]
        if not torch.is_grad_enabled():  # (training differentiates through the keys: no reuse)
            self._den[layer] = (keys, vals, mask)
        return keys, vals, mask

    # --- the caller's side -----------------------------------------------------------------------
    @contextmanager
    def writing(self, positions: torch.Tensor, held: torch.Tensor, valid: torch.Tensor):
        """Around one encoder pass: the new slots' positions (B, n), which of the n columns are
        slots of the row (right padding of a batch of unequal lengths is not), and which are
        attended to (a left-padded prompt's padding is a slot, not valid)."""
        q_ok = held & valid
        self._write = {}
        for s in self.kinds:
            pos = torch.cat([self.pos[s], positions], 1)
            h = torch.cat([self.held[s], held], 1)
            ok = torch.cat([self.valid[s], valid & held], 1)
            allowed = ok[:, None, :] & (pos[:, None, :] <= positions[:, :, None])
            if s:
                allowed &= pos[:, None, :] > positions[:, :, None] - self.window
            allowed |= ~allowed.any(-1, keepdim=True) | ~q_ok[:, :, None]  # padding queries: never read
            keep = h
            if s:  # the last window - 1 held slots
                rank = h.cumsum(1)
                keep = h & (rank > rank[:, -1:] - (self.window - 1))
            order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)
            width = int(keep.sum(1).max()) if keep.numel() else 0
            take = order[:, :width]
            kept = keep.gather(1, take)
            self._write[s] = (allowed[:, None], order, width,
                              pos.gather(1, take), kept, ok.gather(1, take) & kept)
        try:
            yield self
        finally:
            for s in self.kinds:
                _, _, _, self.pos[s], self.held[s], self.valid[s] = self._write[s]
            self._write = None
            self._den.clear()

    def select(self, rows: torch.Tensor) -> "RenoiseKV":
        """A cache of the given rows (a copy of their tensors)."""
        out = RenoiseKV(self.sliding, self.window, 0, self.device)
        out.k = [None if t is None else t[rows] for t in self.k]
        out.v = [None if t is None else t[rows] for t in self.v]
        for s in self.kinds:
            out.pos[s], out.held[s], out.valid[s] = self.pos[s][rows], self.held[s][rows], self.valid[s][rows]
        return out

    def put(self, rows: torch.Tensor, sub: "RenoiseKV") -> None:
        """Write `sub`'s rows back at `rows` (widths grow to fit; trailing unheld columns trimmed)."""
        self._den.clear()
        for s in self.kinds:
            self.pos[s], sub_pos = _fit(self.pos[s], sub.pos[s], 0)
            self.held[s], sub_held = _fit(self.held[s], sub.held[s], False)
            self.valid[s], sub_valid = _fit(self.valid[s], sub.valid[s], False)
            self.pos[s][rows], self.held[s][rows], self.valid[s][rows] = sub_pos, sub_held, sub_valid
        for i in range(len(self.k)):
            if sub.k[i] is None:
                continue
            if self.k[i] is None:
                B, (_, H, _, D) = self.batch, sub.k[i].shape
                self.k[i] = sub.k[i].new_zeros(B, H, 0, D)
                self.v[i] = sub.v[i].new_zeros(B, H, 0, D)
            self.k[i], sk = _fit(self.k[i], sub.k[i], 0.0, dim=2)
            self.v[i], sv = _fit(self.v[i], sub.v[i], 0.0, dim=2)
            self.k[i][rows], self.v[i][rows] = sk, sv
        self._trim()

    def keep(self, rows: torch.Tensor) -> None:
        """Only these rows stay (a finished request's row leaves)."""
        self._den.clear()
        self.k = [None if t is None else t[rows] for t in self.k]
        self.v = [None if t is None else t[rows] for t in self.v]
        for s in self.kinds:
            self.pos[s], self.held[s], self.valid[s] = self.pos[s][rows], self.held[s][rows], self.valid[s][rows]
        self._trim()

    def add_rows(self, n: int) -> None:
        """n empty rows at the end (requests joining)."""
        self._den.clear()
        for s in self.kinds:
            self.pos[s] = torch.cat([self.pos[s], self.pos[s].new_zeros(n, self.pos[s].shape[1])])
            self.held[s] = torch.cat([self.held[s], self.held[s].new_zeros(n, self.held[s].shape[1])])
            self.valid[s] = torch.cat([self.valid[s], self.valid[s].new_zeros(n, self.valid[s].shape[1])])
        for i, t in enumerate(self.k):
            if t is not None:
                self.k[i] = torch.cat([t, t.new_zeros(n, *t.shape[1:])])
                self.v[i] = torch.cat([self.v[i], self.v[i].new_zeros(n, *self.v[i].shape[1:])])

    def _trim(self) -> None:
        for s in self.kinds:
            width = int(self.held[s].sum(1).max()) if self.held[s].numel() else 0
            if width < self.held[s].shape[1]:
                self.pos[s], self.held[s], self.valid[s] = (t[:, :width] for t in (self.pos[s], self.held[s],
                                                                                    self.valid[s]))
                for i, sl in enumerate(self.sliding):
                    if sl == s and self.k[i] is not None:
                        self.k[i], self.v[i] = self.k[i][:, :, :width], self.v[i][:, :, :width]


def _fit(a: torch.Tensor, b: torch.Tensor, fill, dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad `a` and `b` along `dim` to the wider of the two."""
    w = max(a.shape[dim], b.shape[dim])
    return _pad(a, w, fill, dim), _pad(b, w, fill, dim)


def _pad(t: torch.Tensor, width: int, fill, dim: int) -> torch.Tensor:
    if t.shape[dim] == width:
        return t
    shape = list(t.shape)
    shape[dim] = width - t.shape[dim]
    return torch.cat([t, t.new_full(shape, fill)], dim)
