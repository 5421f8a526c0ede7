"""The running requests as rows of batched tensors: what the engine, the cache policies and the
schedule read and write each step.

Canvases are right-padded to a capacity `cap`; column `cap` is a scratch column that padded
entries write to, so scatters never collide with real columns. Every per-row tensor is a field
of RowState declared with `per_row()`; `add` and `keep` go over those fields, so a new one is a
line here."""

from dataclasses import dataclass, field, fields

import torch

from unmask.sampler.schedule import even_split


def per_row(dtype=torch.long, width: bool = False):
    """A per-row tensor field: (n,) or, with `width`, (n, columns)."""
    return field(default=None, metadata={"per_row": True, "dtype": dtype, "width": width})


@dataclass
class RowState:
    device: torch.device
    pad_id: int
    # per-row tensors
    x: torch.Tensor = per_row(width=True)  # (n, cap + 1) token ids
    pos: torch.Tensor = per_row(width=True)  # (n, cap + 1) RoPE positions
    L: torch.Tensor = per_row()  # canvas end: prompt + gen_length
    P: torch.Tensor = per_row()  # prompt end
    blk: torch.Tensor = per_row()  # block length
    spb: torch.Tensor = per_row()  # steps in the current block
    tps: torch.Tensor = per_row()  # a block model's fixed schedule: tokens per step (0: steps per block)
    s: torch.Tensor = per_row()  # the open block [s, e)
    e: torch.Tensor = per_row()
    block: torch.Tensor = per_row()  # index of the open block
    step: torch.Tensor = per_row()  # step inside the open block
    age: torch.Tensor = per_row()  # steps the row has run
    cfg: torch.Tensor = per_row()  # setting id
    since: torch.Tensor = per_row()  # cache policy counter: tokens committed since the last full forward
    kv_done: torch.Tensor = per_row()  # cache policy counter: K/V exact before this column (block models)
    early: torch.Tensor = per_row(torch.bool)  # the row stops at its end of text
    max_post: torch.Tensor = per_row()  # a revising policy's post steps per block (-1: the policy never revises)
    post: torch.Tensor = per_row()  # steps the open block has taken with no mask left (revising policies)
    conf: torch.Tensor = per_row(torch.float32, width=True)  # (n, cap + 1) each token's probability when committed
    quota: torch.Tensor = per_row(width=True)  # (n, steps) tokens to commit at each step of the block
    # host-side
    reqs: list = field(default_factory=list)
    settings: list = field(default_factory=list)  # each row's setting id (no read-back to find them)
    cap: int = 0
    k: list | None = None  # per layer (n, H_kv, cap + 1, D), allocated by the first cached forward
    v: list | None = None

    def __post_init__(self) -> None:
        for f in self._fields():
            shape = (0, 1) if f.metadata["width"] else (0,)
            setattr(self, f.name, torch.zeros(shape, dtype=f.metadata["dtype"], device=self.device))

    @classmethod
    def _fields(cls):
        return [f for f in fields(cls) if f.metadata.get("per_row")]

    @property
    def n(self) -> int:
        return len(self.reqs)

    def _grow(self, cap: int) -> None:
        extra = cap - self.cap
        pad_cols = lambda t, value: torch.cat(  # noqa: E731
            [t[:, : self.cap], torch.full((t.shape[0], extra + 1), value, dtype=t.dtype, device=t.device)], 1)
        self.x, self.pos, self.conf = pad_cols(self.x, self.pad_id), pad_cols(self.pos, 0), pad_cols(self.conf, 0.0)
        if self.k is not None:
            grow = lambda t: torch.cat([t[:, :, : self.cap], t.new_zeros(*t.shape[:2], extra + 1, t.shape[3])], 2)  # noqa: E731
            self.k, self.v = [grow(t) for t in self.k], [grow(t) for t in self.v]
        self.cap = cap

    def add(self, req, mask_id: int, cfg_id: int, steps_width: int, align: int) -> None:
        """Append `req` as a row. `align`: a block-diffusion model's block size (its attention
        blocks are positions [kB, (k+1)B); decoding windows of block_length, which divides B, are
        sub-blocks on the same grid, and the first one holds the end of the prompt), or 0: blocks
        of block_length from the answer's first column. `steps_width`: the quota table's width."""
        p = req.params
        P, L = len(req.prompt), len(req.prompt) + p.gen_length
        if L > self.cap:
            self._grow(L)
        if self.quota.shape[1] < steps_width:
            self.quota = torch.cat([self.quota, self.quota.new_zeros(self.n, steps_width - self.quota.shape[1])], 1)
        x = torch.full((1, self.cap + 1), self.pad_id, dtype=torch.long)
        x[0, :P] = torch.tensor(req.prompt)
        x[0, P:L] = mask_id
        pos = torch.zeros(1, self.cap + 1, dtype=torch.long)
        pos[0, :L] = torch.arange(L)
        e = min((P // p.block_length + 1) * p.block_length, L) if align else P + p.block_length
        row = dict(x=x, pos=pos, L=L, P=P, blk=p.block_length, spb=p.steps_per_block,
                   tps=max(1, p.gen_length // p.total_steps) if align else 0, s=P, e=e, block=0, step=0, age=0,
                   cfg=cfg_id, since=0, kv_done=P // align * align if align else 0, early=req.parts.early_stop,
                   max_post=req.parts.policy.post_steps if getattr(req.parts.policy, "revises", False) else -1, post=0,
                   quota=torch.zeros(1, self.quota.shape[1], dtype=torch.long),
                   conf=torch.zeros(1, self.cap + 1))
        for f in self._fields():
            value = row[f.name]
            if not isinstance(value, torch.Tensor):
                value = torch.tensor([value], dtype=f.metadata["dtype"])
            setattr(self, f.name, torch.cat([getattr(self, f.name), value.to(self.device)]))
        if self.k is not None:
            self.k = [torch.cat([t, t.new_zeros(1, *t.shape[1:])]) for t in self.k]
            self.v = [torch.cat([t, t.new_zeros(1, *t.shape[1:])]) for t in self.v]
        self.reqs.append(req)
        self.settings.append(cfg_id)
        self.start_blocks(torch.tensor([self.n - 1], device=self.device))

    def start_blocks(self, rows: torch.Tensor) -> None:
        """LLaDA's even schedule for rows entering a new (all-masked) block (sampler.schedule);
        rows of a block model take as many steps as their tokens per step need."""
        blk, tps = self.e[rows] - self.s[rows], self.tps[rows]
        spb = torch.where(tps > 0, (blk + tps - 1) // tps.clamp(min=1), self.spb[rows])
        self.spb[rows] = spb
        self.quota[rows] = even_split(blk, spb, self.quota.shape[1])

    def keep(self, keep: torch.Tensor) -> None:
        """Keep only rows `keep` (in that order); the others leave and free their K/V rows."""
        idx = keep.tolist()
        self.reqs = [self.reqs[i] for i in idx]
        self.settings = [self.settings[i] for i in idx]
        for f in self._fields():
            setattr(self, f.name, getattr(self, f.name)[keep])
        if self.k is not None:
            self.k, self.v = [t[keep] for t in self.k], [t[keep] for t in self.v]
        if not self.reqs:  # the last row left: free the buffers
            self.k = self.v = None
