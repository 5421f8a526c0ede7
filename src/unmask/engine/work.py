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
    width: int = 0  # the widest row: a window's query columns, or a full forward's canvas
    ragged: bool = False  # a full forward's rows differ in length (padding to mask)
    writes_kv: bool = False  # a full forward whose rows keep their K/V
    idx: torch.Tensor | None = None
    all_rows: bool = False

    @property
    def full(self) -> bool:
        return self.kind == "full"


def shape(rows: RowState, plan: Plan, run: torch.Tensor | None) -> torch.Tensor:
    """Every size a step's forwards need, as one tensor to read: the widest open block, the
    sealing rows, and `_shape` of the window and full rows that run (None: every row)."""
    seal = plan.seals if run is None else run & plan.seals
    window_rows, full_rows = (~plan.full, plan.full) if run is None else (run & ~plan.full, run & plan.full)
    return torch.stack([(rows.e - rows.s).max(), seal.sum(), *_shape(plan, window_rows, full_rows)])


def _shape(plan: Plan, window: torch.Tensor, full: torch.Tensor) -> list[torch.Tensor]:
    """What sizes a window forward over rows `window` and a full forward over rows `full`: rows,
    positions, the widest window, the longest and shortest canvas, whether any full row keeps K/V."""
    big = torch.iinfo(plan.end.dtype).max
    return [window.sum(), torch.where(window, plan.cost, 0).sum(), torch.where(window, plan.end - plan.start, 0).max(),
            full.sum(), torch.where(full, plan.end, 0).sum(), torch.where(full, plan.end, 0).max(),
            torch.where(full, plan.end, big).min(), (full & plan.kv).any().long()]


class StepWork:
    """The step's forwards, in order: `window()` (the cached rows), then, when a verifying cache
    doubted some of them, `recompute(plan)` with what those rows recompute, then `rest()` (the
    full rows, and the doubted rows that recompute in one more window). Every size the forwards
    need is read in one transfer when the step is planned (and one more after a recomputation),
    unless `sizes` gives them as read already (`shape` of this plan with every row running, read
    with the previous step's report)."""

    def __init__(self, rows: RowState, plan: Plan, run: torch.Tensor | None, verifying: bool,
                 sizes: list[int] | None = None) -> None:
        if run is None:
            run = torch.ones(rows.n, dtype=torch.bool, device=rows.device)
        self.rows, self.plan, self.run, self.verifying = rows, plan, run, verifying
        self.seal = run & plan.seals
        window_rows, full_rows = run & ~plan.full, run & plan.full
        # the step's shape: the widest block, sealing rows, each forward's sizes (one host read)
        self.W, self.n_seal, *sizes = sizes if sizes is not None else shape(rows, plan, run).tolist()
        self._window = self._forwards(window_rows, full_rows, sizes, self.verifying)
        self.committed = torch.zeros(rows.n, dtype=torch.long, device=rows.device)
        self.redo = torch.zeros(rows.n, dtype=torch.bool, device=rows.device)
        self.edits = torch.zeros(rows.n, dtype=torch.long, device=rows.device)  # revising policies' edits
        self.remasked = torch.zeros(rows.n, dtype=torch.long, device=rows.device)
        self.had_mask = torch.zeros(rows.n, dtype=torch.bool, device=rows.device)  # the open block had a mask
        self.records: list[tuple[ForwardRecord, torch.Tensor]] = []
        self._suffix = False  # after a recomputation: the doubted rows' second window

    def _forwards(self, window_rows, full_rows, sizes, verify: bool) -> tuple[Forward, Forward]:
        n_win, pos_win, q, n_full, pos_full, longest, shortest, kv = sizes
        win = Forward("window", window_rows, n_win, pos_win, verify, width=q)
        full = Forward("full", full_rows, n_full, pos_full, False, width=longest, ragged=shortest != longest,
                       writes_kv=bool(kv))
        return win, full

    def window(self) -> list[Forward]:
        """The cached rows' forward (their commits may be doubted by a verifying cache)."""
        return self._ready(self._window[0])

    def doubted(self) -> bool:
        """Did a verifying cache doubt a row's cached step? (a host read, only when one verifies)"""
        return self.verifying and bool(self.redo.any())

    def recompute(self, again: Plan) -> None:
        """The doubted rows recompute the step: in the full forward (the whole canvas), or in one
        more window (the block and the masked suffix), as `again` (their caches' plans) says."""
        self.plan = self.plan.where(self.redo, again)
        full_rows = self._window[1].rows | (self.redo & again.full)
        suffix = self.redo & ~again.full
        suffix_win, full = self._forwards(suffix, full_rows, torch.stack(_shape(self.plan, suffix, full_rows)).tolist(),
                                          False)
        self._window = (suffix_win, full)
        self._suffix = True

    def rest(self) -> list[Forward]:
        """The full rows' forward, then the doubted rows' second window (if any)."""
        win, full = self._window
        return self._ready(full) + (self._ready(win) if self._suffix else [])

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

    def counts(self) -> torch.Tensor:
        """(forwards, 3): each forward's committed, edited and remasked counts (to be read with the
        step's report, in one transfer)."""
        if not self.records:
            return torch.zeros(0, 3, dtype=torch.long, device=self.rows.device)
        return torch.stack([c for _, c in self.records])

    def finish_records(self, counts: list[list[int]]) -> list[ForwardRecord]:
        """The step's records with their counts (as read from `counts()`)."""
        for (rec, _), (n, ed, rm) in zip(self.records, counts):
            rec.committed, rec.edits, rec.remasked = n, ed, rm
        return [rec for rec, _ in self.records]
