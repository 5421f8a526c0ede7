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

from unmask.kv.slots import SlotStore


class RenoiseKV:
    """Row slots: the engine's cache keeps its tensors in the slot store (kv/slots.py) with room
    for more rows and more held slots than it has (`add_rows` takes free rows, `keep` moves only
    the rows a departure displaces, `put` writes a row's slots in place); `k`, `v`, `pos`, `held`,
    `valid` are views of the rows and widths in use. A cache built for one batch (the reference
    loop, training) or by `select` is exactly its size."""

    def __init__(self, sliding: tuple[bool, ...], window: int, batch: int, device) -> None:
        self.sliding, self.window, self.device = tuple(sliding), window, device
        self.kinds = sorted(set(self.sliding))
        self.width = {s: 0 for s in self.kinds}  # held-slot columns in use, per layer kind
        # per layer (rows, H, columns, D), rows / columns >= in use; per layer kind (rows, columns)
        self.slots = SlotStore(batch)
        self._k = self.slots.group("k", dict.fromkeys(range(len(sliding))))
        self._v = self.slots.group("v", dict.fromkeys(range(len(sliding))))
        self._pos = self.slots.group("pos", {s: torch.zeros(batch, 0, dtype=torch.long, device=device)
                                             for s in self.kinds})
        self._held = self.slots.group("held", {s: torch.zeros(batch, 0, dtype=torch.bool, device=device)
                                               for s in self.kinds})
        self._valid = self.slots.group("valid", {s: torch.zeros(batch, 0, dtype=torch.bool, device=device)
                                                 for s in self.kinds})
        self._write = None  # while writing: per kind (mask, order, width, pos, held, valid)
        self.recorded: dict | None = None  # while writing with `record`: layer -> the pass's fresh (k, v)
        # while the held slots do not change (between encoder passes, not training): per layer the
        # denoiser's (keys, values, mask) buffers, held K/V then the canvas's, rewritten in place
        self._den: dict[int, tuple] = {}

    @property
    def n(self) -> int:
        """Rows in use."""
        return self.slots.n

    @property
    def batch(self) -> int:
        return self.n

    @property
    def k(self) -> list[torch.Tensor | None]:
        return [self._held_kv(i)[0] for i in range(len(self.sliding))]

    @property
    def v(self) -> list[torch.Tensor | None]:
        return [self._held_kv(i)[1] for i in range(len(self.sliding))]

    def _held_kv(self, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """One layer's held K/V: views of the rows and slots in use."""
        k, v = self._k[layer], self._v[layer]
        if k is None:
            return None, None
        w = self.width[self.sliding[layer]]
        return k[: self.n, :, :w], v[: self.n, :, :w]

    @property
    def pos(self) -> dict:
        return {s: self._pos[s][: self.n, : self.width[s]] for s in self.kinds}

    @property
    def held(self) -> dict:
        return {s: self._held[s][: self.n, : self.width[s]] for s in self.kinds}

    @property
    def valid(self) -> dict:
        return {s: self._valid[s][: self.n, : self.width[s]] for s in self.kinds}

    # --- the model's side ------------------------------------------------------------------------
    def encoder_keys(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """New slots' K/V (B, H, n, D) -> (keys, values, mask (B, 1, n, T)) to attend over; the
        layer's held K/V become the old ones and the new ones, truncated as the layer keeps them."""
        mask, order, width = self._write[self.sliding[layer]][:3]
        if self.recorded is not None:
            self.recorded[layer] = (k, v)
        old_k, old_v = self._held_kv(layer)
        keys = k if old_k is None else torch.cat([old_k, k], 2)
        vals = v if old_v is None else torch.cat([old_v, v], 2)
        idx = order[:, None, :width, None].expand(-1, keys.shape[1], -1, keys.shape[3])
        self._k[layer], self._v[layer] = keys.gather(2, idx), vals.gather(2, idx)
        return keys, vals, mask

    def denoiser_keys(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """The canvas's K/V (B, H, L, D) -> (keys, values, mask or None): the held slots and the
        canvas, bidirectionally (padding masked)."""
        old_k, old_v = self._held_kv(layer)
        if old_k is None:
            return k, v, None
        held = old_k.shape[2]
        buf = self._den.get(layer)
        if buf is not None and buf[0].shape == (k.shape[0], k.shape[1], held + k.shape[2], k.shape[3]):
            keys, vals, mask = buf  # the held part is as the last step left it: only the canvas is new
            keys[:, :, held:], vals[:, :, held:] = k, v
            return keys, vals, mask
        keys, vals = torch.cat([old_k, k], 2), torch.cat([old_v, v], 2)
        s = self.sliding[layer]
        valid = self._valid[s][: self.n, : self.width[s]]
        mask = None
        if not bool(valid.all()):
            mask = torch.cat([valid, valid.new_ones(valid.shape[0], k.shape[2])], 1)[:, None, None, :]
        if not torch.is_grad_enabled():  # (training differentiates through the keys: no reuse)
            self._den[layer] = (keys, vals, mask)
        return keys, vals, mask

    # --- the caller's side -----------------------------------------------------------------------
    @contextmanager
    def writing(self, positions: torch.Tensor, held: torch.Tensor, valid: torch.Tensor, record: bool = False):
        """Around one encoder pass: the new slots' positions (B, n), which of the n columns are
        slots of the row (right padding of a batch of unequal lengths is not), and which are
        attended to (a left-padded prompt's padding is a slot, not valid). Afterwards the cache is
        exactly its rows and held slots. `record`: keep every layer's fresh K/V of the pass in
        `recorded` (whole, before a sliding layer drops its old slots: a prefix cache's pages)."""
        q_ok = held & valid
        self._write = {}
        self.recorded = {} if record else None
        pos_now, held_now, valid_now = self.pos, self.held, self.valid
        for s in self.kinds:
            pos = torch.cat([pos_now[s], positions], 1)
            h = torch.cat([held_now[s], held], 1)
            ok = torch.cat([valid_now[s], valid & held], 1)
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
                self.width[s] = self._write[s][2]
                _, _, _, self._pos[s], self._held[s], self._valid[s] = self._write[s]
            self._write = None
            self._den.clear()

    @classmethod
    def holding(cls, sliding: tuple[bool, ...], window: int, k: list, v: list, m: int, device) -> "RenoiseKV":
        """One row holding the slots of positions [0, m) (a prompt prefix whose K/V are known:
        k, v per layer (H, m, D)), each layer as an encoder pass over them would leave it
        (sliding layers: the last window - 1)."""
        out = cls(sliding, window, 1, device)
        for s in out.kinds:
            w = min(m, window - 1) if s else m
            out.width[s] = w
            out._pos[s] = torch.arange(m - w, m, device=device)[None]
            out._held[s] = torch.ones(1, w, dtype=torch.bool, device=device)
            out._valid[s] = out._held[s].clone()
        for i, s in enumerate(sliding):
            w = out.width[s]
            out._k[i], out._v[i] = k[i][None, :, m - w:], v[i][None, :, m - w:]
        return out

    def select(self, rows: torch.Tensor) -> "RenoiseKV":
        """A cache of the given rows (a copy of their tensors, exactly their size)."""
        out = RenoiseKV(self.sliding, self.window, rows.numel(), self.device)
        out.width = dict(self.width)
        for i, (k, v) in enumerate(zip(self.k, self.v)):
            out._k[i], out._v[i] = (None, None) if k is None else (k[rows], v[rows])
        pos, held, valid = self.pos, self.held, self.valid
        for s in self.kinds:
            out._pos[s], out._held[s], out._valid[s] = pos[s][rows], held[s][rows], valid[s][rows]
        return out

    def put(self, rows: torch.Tensor, sub: "RenoiseKV") -> None:
        """Write `sub`'s rows back at `rows`, in place (the store widens when `sub` holds more slots
        than it has room for; columns past a row's slots are neither held nor valid)."""
        self._den.clear()
        for s in self.kinds:
            w = sub.width[s]
            self._reserve(w, s)
            self._pos[s][rows, :w], self._pos[s][rows, w:] = sub.pos[s], 0
            self._held[s][rows, :w], self._held[s][rows, w:] = sub.held[s], False
            self._valid[s][rows, :w], self._valid[s][rows, w:] = sub.valid[s], False
            self.width[s] = max(self.width[s], w)
        for i, (sk, sv) in enumerate(zip(sub.k, sub.v)):
            if sk is None:
                continue
            if self._k[i] is None:
                C, T = self._pos[self.sliding[i]].shape
                self._k[i] = sk.new_zeros(max(C, self.slots.slots), sk.shape[1], T, sk.shape[3])
                self._v[i] = sv.new_zeros(max(C, self.slots.slots), sv.shape[1], T, sv.shape[3])
            self._k[i][rows, :, : sk.shape[2]], self._v[i][rows, :, : sv.shape[2]] = sk, sv
        self._trim()

    def keep(self, perm: torch.Tensor) -> None:
        """Only these rows stay, row i being old row perm[i] (a finished request's row leaves).
        Only the rows that move are copied (engine/rows.py moves the last rows into freed ones)."""
        self._den.clear()
        self.slots.keep(perm)
        if self.n == 0:  # the last row left: the store is freed
            self.__init__(self.sliding, self.window, 0, self.device)
            return
        self._trim()

    def add_rows(self, n: int) -> None:
        """n empty rows at the end (requests joining): free rows of the store (it grows by half
        when full)."""
        self._den.clear()
        self.slots.add(n)  # positions 0, neither held nor valid

    def _reserve(self, cols: int, s: bool) -> None:
        """Room for `cols` held slots of layer kind `s` (grown by half, copied)."""
        T = self._pos[s].shape[1]
        if cols <= T:
            return
        cols = max(cols, T + T // 2)
        for name in ("pos", "held", "valid"):
            self.slots.widen(name, 1, cols, keys=[s])
        layers = [i for i, sl in enumerate(self.sliding) if sl == s]
        self.slots.widen("k", 2, cols, keys=layers)
        self.slots.widen("v", 2, cols, keys=layers)

    def _trim(self) -> None:
        """The widths in use: the most slots a row holds (no copy)."""
        held = self.held
        for s in self.kinds:
            self.width[s] = int(held[s].sum(1).max()) if held[s].numel() else 0

