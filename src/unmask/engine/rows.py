"""Running requests as rows of batched tensors: the generic container every row kind keeps its
per-row state in, and the masked kind's own rows (RowState).

A row kind declares its per-row tensors as dataclass fields with `per_row()`; `append`, `remove`
and `grow` go over those fields, so a new one is a line in the kind's rows and no hand-written
list of names. Canvas-wide fields (`cols=True`) are right-padded to a capacity `cap`; column `cap`
is a scratch column that padded entries write to, so scatters never collide with real columns.

K/V memory (`layers=True` fields: per layer (n, H, cap + 1, D)) and other `slots` fields live in
the rows' slot store (kv/slots.py, the one every K/V cache uses): each is a view of the first n
slots. A joining row takes the next slot; a departing row's slot is filled by the last row, so
rows are in no particular order — the scheduler orders them by `seq`, their admission order. The
store is allocated by the first forward that writes K/V and freed when the last row leaves;
`lazy` fields likewise (allocated by the kind)."""

from dataclasses import dataclass, field, fields

import torch

from unmask.engine.grow import START, grows
from unmask.kv.slots import SlotStore
from unmask.sampler.schedule import even_split


def per_row(dtype=torch.long, cols: bool = False, fill=0, lazy: bool = False, layers: bool = False,
            slots: bool = False):
    """A per-row field: (n,), or with `cols` (n, cap + 1) padded with `fill` ("pad": the pad id), or a tensor whose
    first dimension is the row (any trailing shape, set by the kind when it starts empty).
    `lazy`: None until the kind allocates it for every row; `layers`: a list of per-layer
    (n, H, cap + 1, D) tensors in slots (see above), lazy as well; `slots`: one large lazy tensor
    kept in slots the same way (allocated by `allocate`)."""
    return field(default=None, metadata={"per_row": True, "dtype": dtype, "cols": cols, "fill": fill,
                                         "lazy": lazy or layers or slots, "layers": layers,
                                         "slots": slots or layers})


@dataclass
class Rows:
    device: torch.device
    pad_id: int
    reqs: list = field(default_factory=list)
    cap: int = 0
    seq: torch.Tensor = per_row()  # admission order (the scheduler's "oldest first")
    # per-token log-probabilities of rows that asked for them (engine/logprobs.py): each
    # column's chosen token's, and the most likely tokens (n, cap + 1, TOP_LOGPROBS) with theirs
    lp: torch.Tensor | None = per_row(torch.float32, cols=True, lazy=True)
    top_ids: torch.Tensor | None = per_row(cols=True, lazy=True)
    top_lp: torch.Tensor | None = per_row(torch.float32, cols=True, lazy=True)
    slots: SlotStore = field(default_factory=SlotStore)  # slot fields: layers -> per layer (slots, H, cap + 1, D)
    state: dict = field(default_factory=dict)  # counters declared by a component (a cache policy): name -> (n,)
    _next_seq: int = 0

    def __post_init__(self) -> None:
        for f in self._fields():
            if not f.metadata["lazy"]:
                shape = (0, 1) if f.metadata["cols"] else (0,)
                setattr(self, f.name, torch.zeros(shape, dtype=f.metadata["dtype"], device=self.device))

    @classmethod
    def _fields(cls):
        return [f for f in fields(cls) if f.metadata.get("per_row")]

    @property
    def n(self) -> int:
        return len(self.reqs)

    def _fill(self, f):
        return self.pad_id if f.metadata["fill"] == "pad" else f.metadata["fill"]

    @torch.inference_mode()
    def grow(self, cap: int) -> None:
        """Widen every canvas-wide field (and the K/V rows) to `cap` columns plus the scratch one."""
        if cap <= self.cap:
            return
        extra = cap - self.cap
        for name in self.slots.groups:  # a wider K/V store (a longer canvas joined: rare)
            if self._meta(name)["layers"]:
                self.slots.widen(name, 2, cap + 1, keep=self.cap)
        for f in self._fields():
            t = getattr(self, f.name)
            if t is None or f.metadata["layers"]:
                continue
            if f.metadata["cols"]:
                pad = torch.full((t.shape[0], extra + 1, *t.shape[2:]), self._fill(f), dtype=t.dtype, device=t.device)
                setattr(self, f.name, torch.cat([t[:, : self.cap], pad], 1))
        self.cap = cap
        self._views()

    def _meta(self, name: str) -> dict:
        return next(f.metadata for f in self._fields() if f.name == name)

    def _views(self) -> None:
        """Each slot field: the first n slots of its store (a list per layer for K/V)."""
        for name in self.slots.groups:
            view = list(self.slots.view(name).values())
            setattr(self, name, view if self._meta(name)["layers"] else view[0])

    @torch.inference_mode()
    def append(self, reqs: list, values: dict) -> None:
        """Append `reqs` as rows; `values[name]`: a (k, ...) tensor (or a list / scalar) for each
        eager field (a canvas-wide one at the current capacity); lazy fields that exist get rows of
        zeros, and an eager field not given gets its fill."""
        k = len(reqs)
        values = {**values, "seq": list(range(self._next_seq, self._next_seq + k))}
        self._next_seq += k
        self.slots.add(k)
        for name, cur in self.state.items():
            value = values.get(name, [0] * k)
            self.state[name] = torch.cat([cur, torch.as_tensor(value, dtype=torch.long).to(self.device).reshape(k)])
        for f in self._fields():
            cur = getattr(self, f.name)
            if cur is None or f.metadata["slots"]:
                continue
            value = values.get(f.name)
            if value is None:
                value = cur.new_full((k, *cur.shape[1:]), self._fill(f))
            elif not isinstance(value, torch.Tensor):
                value = torch.tensor(value if isinstance(value, list) else [value] * k, dtype=f.metadata["dtype"])
            setattr(self, f.name, torch.cat([cur, value.to(self.device, f.metadata["dtype"])]))
        self.reqs += reqs
        self._views()

    @torch.inference_mode()
    def remove(self, gone: list[int]) -> list[int]:
        """Rows `gone` leave; the last rows move into their slots (one row moved per departure).
        Returns the new order as old row indices (row i is now the old row perm[i])."""
        n, drop = self.n, set(gone)
        m = n - len(drop)
        holes = [h for h in sorted(drop) if h < m]
        movers = [i for i in range(m, n) if i not in drop]
        perm = list(range(m))
        for h, src in zip(holes, movers):
            perm[h] = src
        self.reqs = [self.reqs[i] for i in perm]
        self.slots.keep(perm)  # the last row leaving frees the K/V store
        index = torch.tensor(perm, dtype=torch.long, device=self.device)
        self.state = {name: t[index] for name, t in self.state.items()}
        for f in self._fields():
            t = getattr(self, f.name)
            if t is None or f.metadata["slots"]:
                if m == 0 and f.metadata["lazy"]:
                    setattr(self, f.name, None)
                continue
            setattr(self, f.name, None if m == 0 and f.metadata["lazy"] else t[index])
        self._views()
        return perm

    def col_fields(self) -> list[tuple[str, object]]:
        """(name, fill) of the canvas-wide fields that hold a value per column (allocated ones; not
        the K/V rows, nor `pos`, which follows from the canvas length)."""
        return [(f.name, self._fill(f)) for f in self._fields() if f.metadata["cols"] and not f.metadata["layers"]
                and f.name != "pos" and getattr(self, f.name) is not None]

    def declare(self, name: str) -> None:
        """A per-row counter a component owns (`state[name]`, (n,) long; 0 for rows already there)."""
        if name not in self.state:
            self.state[name] = torch.zeros(self.n, dtype=torch.long, device=self.device)

    def drop(self, req) -> list[int]:
        """Remove one request's row."""
        return self.remove([self.reqs.index(req)])

    def allocate(self, name: str, tail: tuple, dtype: torch.dtype) -> torch.Tensor:
        """The slot field `name` ((n, *tail) view of its store), allocated now as zeros if it is not."""
        if name not in self.slots:
            self.slots.group(name, {0: torch.zeros((self.n, *tail), dtype=dtype, device=self.device)})
            self._views()
        return getattr(self, name)

    def allocate_cols(self, name: str, tail: tuple = ()) -> torch.Tensor:
        """The lazy canvas-wide field `name` ((n, cap + 1, *tail)), allocated now as zeros if it is
        not (later rows get zeros too; freed with the last row)."""
        if getattr(self, name) is None:
            meta = self._meta(name)
            setattr(self, name, torch.zeros((self.n, self.cap + 1, *tail), dtype=meta["dtype"], device=self.device))
        return getattr(self, name)

    def layer_buffers(self, name: str, num_layers: int, like: torch.Tensor) -> list:
        """The per-layer field `name` (K/V rows: (n, H, cap + 1, D) views of its slot store),
        allocated now as zeros if it is not yet."""
        if name not in self.slots:
            shape = (self.n, like.shape[1], self.cap + 1, like.shape[3])
            self.slots.group(name, {i: like.new_zeros(shape) for i in range(num_layers)})
            self._views()
        return getattr(self, name)


@dataclass
class RowState(Rows):
    """A masked row's canvas and its block, schedule and cache-policy counters."""

    x: torch.Tensor = per_row(cols=True, fill="pad")  # (n, cap + 1) token ids
    pos: torch.Tensor = per_row(cols=True)  # (n, cap + 1) RoPE positions
    L: torch.Tensor = per_row()  # the generated region's end: prompt + gen_length
    T: torch.Tensor = per_row()  # the canvas's end: L + the suffix after the hole (infilling), else L
    P: torch.Tensor = per_row()  # prompt end
    lim: torch.Tensor = per_row()  # a growing hole's bound: P + gen_length (0: the hole does not grow, engine/grow.py)
    budget: torch.Tensor = per_row()  # expansions a growing hole may still make (DreamOn's expand budget)
    blk: torch.Tensor = per_row()  # block length
    spb: torch.Tensor = per_row()  # steps in the current block
    tps: torch.Tensor = per_row()  # a block model's fixed schedule: tokens per step (0: steps per block)
    s: torch.Tensor = per_row()  # the open block [s, e)
    e: torch.Tensor = per_row()
    block: torch.Tensor = per_row()  # index of the open block
    step: torch.Tensor = per_row()  # step inside the open block
    age: torch.Tensor = per_row()  # steps the row has run
    cfg: torch.Tensor = per_row()  # setting id
    early: torch.Tensor = per_row(torch.bool)  # the row stops at its end of text
    minl: torch.Tensor = per_row()  # P + min_tokens: no end-of-text proposed before this column
    max_post: torch.Tensor = per_row()  # a revising policy's post steps per block (-1: the policy never revises)
    post: torch.Tensor = per_row()  # steps the open block has taken with no mask left (revising policies)
    reused: torch.Tensor = per_row()  # prompt columns whose K/V came from the prefix cache (kv/prefix.py)
    conf: torch.Tensor = per_row(torch.float32, cols=True)  # (n, cap + 1) each token's probability when committed
    quota: torch.Tensor = per_row()  # (n, steps) tokens to commit at each step of the block
    k: list | None = per_row(layers=True)  # per layer (n, H_kv, cap + 1, D): the rows' K/V
    v: list | None = per_row(layers=True)
    settings: list = field(default_factory=list)  # each row's setting id (no read-back to find them)
    distinct: list = field(default_factory=list)  # the setting ids in use, sorted (kept on add / remove)
    mask_id: int = 0
    stop_ids: torch.Tensor | None = None  # (k,) end-of-text ids
    mins: list = field(default_factory=list)  # each row: has min_tokens (host-side: stop ids masked only then)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.quota = torch.zeros(0, 1, dtype=torch.long, device=self.device)

    def add(self, req, mask_id: int, cfg_id: int, steps_width: int, align: int) -> None:
        """Append `req` as a row. `align`: a block-diffusion model's block size (its attention
        blocks are positions [kB, (k+1)B); decoding windows of block_length, which divides B, are
        sub-blocks on the same grid, and the first one holds the end of the prompt), or 0: blocks
        of block_length from the answer's first column. `steps_width`: the quota table's width."""
        p = req.params
        P, L = len(req.prompt), len(req.prompt) + p.gen_length
        lim = L if grows(req) else 0
        if lim:  # a growing hole starts short; its row holds room for its bound
            L = P + min(START, p.gen_length)
            steps_width = max(steps_width, p.gen_length)
        T = L + len(req.suffix)
        self.grow(max(T, lim + len(req.suffix)))
        if self.quota.shape[1] < steps_width:
            self.quota = torch.cat([self.quota, self.quota.new_zeros(self.n, steps_width - self.quota.shape[1])], 1)
        x = torch.full((1, self.cap + 1), self.pad_id, dtype=torch.long)
        x[0, :P] = torch.tensor(req.prompt)
        x[0, P:L] = mask_id if req.fill is None else torch.tensor(req.fill)
        if req.suffix:
            x[0, L:T] = torch.tensor(req.suffix)
        pos = torch.zeros(1, self.cap + 1, dtype=torch.long)
        pos[0, :T] = torch.arange(T)
        e = min((P // p.block_length + 1) * p.block_length if align else P + p.block_length, L)
        cache = req.parts.cache
        for name in cache.row_state:  # the counters its cache policy keeps per row
            self.declare(name)
        self.append([req], dict(
            **{name: [init(P, align)] for name, init in cache.row_state.items()},
            x=x, pos=pos, L=L, T=T, P=P, lim=lim, budget=p.gen_length if lim else 0, blk=p.block_length,
            spb=p.steps_per_block,
            # a block model's fixed schedule, and a growing hole's (its masks change as it decodes)
            tps=max(1, p.gen_length // p.total_steps) if align or lim else 0, s=P, e=e, block=0, step=0, age=0,
            # a template's row runs to the end of its region: an end of text ends a hole, not the row
            cfg=cfg_id, early=req.parts.early_stop and req.fill is None, minl=P + _min_tokens(req),
            max_post=req.parts.policy.post_steps if req.parts.policy.revises else -1, post=0))
        self.settings.append(cfg_id)
        self.mins.append(_min_tokens(req) > 0)
        if cfg_id not in self.distinct:
            self.distinct = sorted(self.distinct + [cfg_id])
        self.start_blocks(torch.tensor([self.n - 1], device=self.device))

    def start_blocks(self, rows: torch.Tensor) -> None:
        """LLaDA's even schedule over the masks of the block each row enters (sampler.schedule;
        every position of a block but a template's fixed text between holes); rows of a block
        model take as many steps as their tokens per step need. `rows`: indices, or an (n,) bool
        (tensor code over every row: no read-back to find them)."""
        cols = torch.arange(self.cap + 1, device=self.device)[None, :]
        masks = ((self.x == self.mask_id) & (cols >= self.s[:, None]) & (cols < self.e[:, None])).sum(-1)
        if rows.dtype == torch.bool:
            blk, tps = masks, self.tps
            spb = torch.where(tps > 0, (blk + tps - 1) // tps.clamp(min=1), self.spb)
            self.spb = torch.where(rows, spb, self.spb)
            split = even_split(blk, spb.clamp(min=1), self.quota.shape[1])  # (rows not starting: unused)
            self.quota = torch.where(rows[:, None], split, self.quota)
            return
        blk, tps = masks[rows], self.tps[rows]
        spb = torch.where(tps > 0, (blk + tps - 1) // tps.clamp(min=1), self.spb[rows])
        self.spb[rows] = spb
        self.quota[rows] = even_split(blk, spb, self.quota.shape[1])

    def remove(self, gone: list[int]) -> list[int]:
        perm = super().remove(gone)
        self.settings = [self.settings[i] for i in perm]
        self.mins = [self.mins[i] for i in perm]
        self.distinct = sorted(set(self.settings))
        return perm


def _min_tokens(req) -> int:
    """Tokens before which no end of text is proposed: the request's min_tokens, and at least one
    in a hole whose length is bounded (an end of text at its first position would leave it empty)."""
    bounded = bool(req.suffix) and req.fill is None and req.params.hole_length != "exact"
    return max(req.params.min_tokens, 1 if bounded else 0)
