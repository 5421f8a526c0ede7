"""One step's forwards, sized once from the plan and the token budget: the window rows' forward,
the full rows' forward, and the recomputation of rows whose cache doubted their cached step."""

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
    """Iterate it for the step's forwards (each yielded after the previous one committed)."""

    def __init__(self, rows: RowState, plan: Plan, run: torch.Tensor, verifying: bool, replan) -> None:
        """`replan()`: the plan of what doubted rows recompute (their cache policies')."""
        self.rows, self.plan, self.run, self.verifying, self.replan = rows, plan, run, verifying, replan
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

    def __iter__(self):
        yield from self._ready(Forward("window", self.window_rows, self.n_win, self.pos_win, self.verifying))
        full_rows, count, positions = self.full_rows, self.n_full, self.pos_full
        suffix = None
        if self.verifying and bool(self.redo.any()):
            # doubted rows recompute the step: in the full forward (the whole canvas), or in one more
            # window (the block and the masked suffix), as their cache says
            again = self.replan()
            self.plan = self.plan.where(self.redo, again)
            full_rows = full_rows | (self.redo & again.full)
            suffix = self.redo & ~again.full
            count, positions, n_suffix, pos_suffix = torch.stack([
                full_rows.sum(), torch.where(full_rows, self.plan.end, 0).sum(), suffix.sum(),
                torch.where(suffix, self.plan.cost, 0).sum()]).tolist()
        yield from self._ready(Forward("full", full_rows, count, positions, False))
        if suffix is not None and n_suffix:
            yield from self._ready(Forward("window", suffix, n_suffix, pos_suffix, False))

    def _ready(self, f: Forward):
        if f.count:
            n = self.rows.n
            f.all_rows = f.count == n
            f.idx = torch.arange(n, device=self.rows.device) if f.all_rows else f.rows.nonzero().squeeze(-1)
            yield f

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
