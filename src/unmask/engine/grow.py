"""Holes that grow and shrink (hole_length "grow", DreamOn's expand and delete): a model trained
with an expand token decides the hole's length while it decodes.

A growing hole starts as `START` masks (DreamOn's evaluation starts at 4), at most its bound
(gen_length). After each step, in the hole's columns that were masks before the step:
- **expand**: a position committed to the expand token becomes two masks (the hole lengthens by
  one), while the hole is shorter than its bound and has expansions left (DreamOn's expand
  budget: gen_length in all, so that expanding and deleting cannot go on forever); otherwise the
  expand token is never proposed (its logit is -inf), and expansions of one step beyond what is
  left stay masks;
- **delete**: an end of text committed there ends the hole: it and every position after it that
  was a mask before the step leave the canvas (DreamOn's end-of-text padding to the right, then
  deletion); tokens committed before it stay.
The columns after an edit move (the suffix too), and the row's open block starts its schedule
again over the masks it now has (tokens per step as the parameters give: gen_length / steps),
so every cache that refreshes at a block start (prefix, dual, adaptive) recomputes the moved
K/V at once; committed tokens before the first edit never move, so the streamed prefix is
never retracted. Rows of every length batch together; the edit is tensor code over all rows
(rows without an edit map to themselves)."""

import torch

START = 4  # masks a growing hole starts with (DreamOn's min_gen_len)


def grows(req) -> bool:
    """Does this request's hole grow (a suffix, no template fill, hole_length "grow")?"""
    return bool(req.suffix) and req.fill is None and req.params.hole_length == "grow"


class Growth:
    """The rows whose holes grow: holding the expand token where it may not be written, and the
    canvas edits after each step (see the module docstring)."""

    def __init__(self, rows, expand_id: int | None, mask_id: int, tp=None, vocab: int = 0) -> None:
        self.rows, self.expand, self.mask = rows, expand_id, mask_id
        self.count = 0  # running rows whose holes grow (host-side: no edit pass without one)
        self.local = expand_id  # the expand id in this rank's vocabulary slice (None: not in it)
        if tp is not None and expand_id is not None:
            lo, hi = tp.vocab_range(vocab)
            self.local = expand_id - lo if lo <= expand_id < hi else None

    def admit(self, req) -> None:
        self.count += grows(req)

    def remove(self, reqs: list) -> None:
        self.count -= sum(grows(q) for q in reqs)

    def hold(self, idx: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The logits with the expand token at -inf for rows that may not lengthen now: rows whose
        hole does not grow, and growing holes at their bound or out of expansions."""
        if self.local is None:
            return logits
        r = self.rows
        banned = ((r.lim[idx] <= r.L[idx]) | (r.budget[idx] <= 0))[:, None]  # lim 0: not a growing row
        logits[..., self.local].masked_fill_(banned, -torch.inf)  # the forward's own logits, in place
        return logits

    def before(self) -> torch.Tensor | None:
        """Which columns are masks before the step (None: no growing row runs)."""
        return (self.rows.x == self.mask) if self.count else None

    @torch.inference_mode()
    def edit(self, was: torch.Tensor) -> torch.Tensor:
        """Apply the step's expansions and deletions (`was`: `before()`'s masks). Returns (n,)
        bool: the rows whose canvas changed (their block's schedule starts again)."""
        r = self.rows
        cap = r.cap
        cols = torch.arange(cap + 1, device=r.device)[None, :]
        hole = (r.lim > 0)[:, None] & (cols >= r.P[:, None]) & (cols < r.L[:, None]) & was
        stop = torch.isin(r.x, r.stop_ids) & hole
        first = torch.where(stop.any(1), stop.int().argmax(1), cap + 1)
        delete = hole & (cols >= first[:, None])
        expand = hole & (r.x == self.expand) & ~delete if self.expand is not None else torch.zeros_like(hole)
        room = torch.minimum(r.lim - r.L + delete.sum(1), r.budget)
        over = expand & (expand.long().cumsum(1) > room[:, None])
        r.x = torch.where(over, self.mask, r.x)  # past the bound: still masks
        expand = expand & ~over
        r.budget = r.budget - expand.sum(1)
        width = 1 - delete.long() + expand.long()
        new = width.cumsum(1) - width  # each old column's first new column
        delta = expand.sum(1) - delete.sum(1)
        keep = (cols < r.T[:, None]) & ~delete
        dest = torch.where(keep, new, cap).clamp(max=cap)
        spread = torch.zeros_like(expand)
        spread.scatter_(1, torch.where(expand, new, cap).clamp(max=cap), True)
        spread.scatter_(1, torch.where(expand, new + 1, cap).clamp(max=cap), True)
        for name, fill in r.col_fields():
            t = getattr(r, name)
            out = torch.full_like(t, fill)
            index = dest if t.dim() == 2 else dest[..., None].expand_as(t)
            out.scatter_(1, index, t)
            if name == "x":  # an expansion becomes two masks
                out = out.masked_fill(spread, self.mask)
            out[:, cap] = fill
            setattr(r, name, out)
        r.pos = torch.where(cols < (r.T + delta)[:, None], cols, 0)
        changed = (delete | expand).any(1)
        r.e = r.e + (torch.where(cols < r.e[:, None], width - 1, 0)).sum(1)  # the open block keeps what it held
        r.L, r.T = r.L + delta, r.T + delta
        r.e = torch.minimum(torch.maximum(r.e, r.s), r.L)
        return changed
