"""A masked step's forwards, sized once from the plan and the token budget: the window rows'
forward, the full rows' forward, and the recomputation of rows whose cache doubted their cached
step (engine/masked.py runs them in that order)."""

from dataclasses import dataclass

import torch

from unmask.cache.base import Plan
from unmask.engine.commit import Committed
from unmask.engine.rows import RowState
from unmask.trace import ForwardRecord


@dataclass
class Forward:
    kind: str  # "window" | "full"
    rows: torch.Tensor  # (n,) bool
    count: int
    positions: int  # summed over the rows
    verify: bool  # a verifying cache may doubt this forward's commits
    idx: torch.Tensor | None = None
    all_rows: bool = False

    @property
    def full(self) -> bool:
        return self.kind == "full"


class StepWork:
    """The step's forwards, in order: `window()` (the cached rows), then, when a verifying cache
    doubted some of them, `recompute(plan)` with what those rows recompute, then `rest()` (the
    full rows, and the doubted rows that recompute in one more window)."""

    def __init__(self, rows: RowState, plan: Plan, run: torch.Tensor, verifying: bool) -> None:
        self.rows, self.plan, self.run, self.verifying = rows, plan, run, verifying
        self.seal = run & plan.seals
        self.window_rows, self.full_rows = run & ~plan.full, run & plan.full
        cost = plan.cost
        # one host read for the step's shape: widest block, rows and positions of each kind
        self.W, self.n_win, self.n_full, self.pos_win, self.pos_full, self.n_seal = torch.stack([
            (rows.e - rows.s).max(), self.window_rows.sum(), self.full_rows.sum(),
            torch.where(self.window_rows, cost, 0).sum(), torch.where(self.full_rows, cost, 0).sum(),
            self.seal.sum()]).tolist()
        self.committed = torch.zeros(rows.n, dtype=torch.long, device=rows.device)
        self.redo = torch.zeros(rows.n, dtype=torch.bool, device=rows.device)
        self.edits = torch.zeros(rows.n, dtype=torch.long, device=rows.device)  # revising policies' edits
        self.remasked = torch.zeros(rows.n, dtype=torch.long, device=rows.device)
        self.had_mask = torch.zeros(rows.n, dtype=torch.bool, device=rows.device)  # the open block had a mask
        self.records: list[tuple[ForwardRecord, torch.Tensor]] = []
        self._suffix = None

    def window(self) -> list[Forward]:
        """The cached rows' forward (their commits may be doubted by a verifying cache)."""
        return self._ready(Forward("window", self.window_rows, self.n_win, self.pos_win, self.verifying))

    def doubted(self) -> bool:
        """Did a verifying cache doubt a row's cached step? (a host read, only when one verifies)"""
        return self.verifying and bool(self.redo.any())

    def recompute(self, again: Plan) -> None:
        """The doubted rows recompute the step: in the full forward (the whole canvas), or in one
        more window (the block and the masked suffix), as `again` (their caches' plans) says."""
        self.plan = self.plan.where(self.redo, again)
        self.full_rows = self.full_rows | (self.redo & again.full)
        self._suffix = self.redo & ~again.full
        self.n_full, self.pos_full, self.n_suffix, self.pos_suffix = torch.stack([
            self.full_rows.sum(), torch.where(self.full_rows, self.plan.end, 0).sum(), self._suffix.sum(),
            torch.where(self._suffix, self.plan.cost, 0).sum()]).tolist()

    def rest(self) -> list[Forward]:
        """The full rows' forward, then the doubted rows' second window (if any)."""
        out = self._ready(Forward("full", self.full_rows, self.n_full, self.pos_full, False))
        if self._suffix is not None:
            out += self._ready(Forward("window", self._suffix, self.n_suffix, self.pos_suffix, False))
        return out

    def _ready(self, f: Forward) -> list[Forward]:
        if not f.count:
            return []
        n = self.rows.n
        f.all_rows = f.count == n
        f.idx = torch.arange(n, device=self.rows.device) if f.all_rows else f.rows.nonzero().squeeze(-1)
        return [f]

    def record(self, f: Forward, done: Committed, seconds: float) -> None:
        self.committed[done.idx] = done.counts
        self.had_mask[done.idx] = done.candidates.any(-1)
        zero = done.counts.new_zeros(())
        if done.edits is not None:
            self.edits[done.idx] = done.edits
            self.remasked[done.idx] = done.remasked
        if done.doubted is not None:
            self.redo[done.idx] = done.doubted
        label = "seal" if f.kind == "window" and self.n_seal else f.kind
        rec = ForwardRecord(label, f.count, f.positions / f.count, 0, seconds, self.n_seal if label == "seal" else 0)
        self.records.append((rec, torch.stack([done.counts.sum(),
                                               zero if done.edits is None else done.edits.sum(),
                                               zero if done.remasked is None else done.remasked.sum()])))

    def finish_records(self) -> list[ForwardRecord]:
        """The step's records, their committed, edited and remasked counts read in one transfer."""
        if self.records:
            for (rec, _), (n, ed, rm) in zip(self.records, torch.stack([c for _, c in self.records]).tolist()):
                rec.committed, rec.edits, rec.remasked = n, ed, rm
        return [rec for rec, _ in self.records]
