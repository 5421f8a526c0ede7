"""After a masked step's forwards: blocks advance, stops are found (`settle`, tensors only), and
what the step did is read in one transfer and reported to the engine (`report`; engine/kind.py
Report)."""

from dataclasses import dataclass

import torch

from unmask.engine.kind import Report, Stats
from unmask.engine.rows import RowState
from unmask.engine.work import StepWork
from unmask.sampler.stops import first_stop


def settle(rows: RowState, work: StepWork, restart: torch.Tensor | None = None) -> torch.Tensor:
    """Per-row bookkeeping in tensors; returns what the step's one transfer reads: each row's
    counts and its open block's tokens, then each forward's counts (`report` takes them as read;
    the caller may read more along with them).

    A revising policy's block (rows with max_post >= 0) stays open after its last mask: the next
    steps are post steps, up to max_post of them, and the first post step that edits nothing ends
    it. Its tokens are final only once the block ends: the streamed prefix stops at the open
    block, and an end of text stops the row only in a finished block. `restart`: rows whose open
    block changed length this step (a growing hole, engine/grow.py): its schedule starts again."""
    r, w = rows, work
    run, s, e, committed, had_mask, edits, remasked = w.run, r.s, r.e, w.committed, w.had_mask, w.edits, w.remasked
    cols = torch.arange(r.cap + 1, device=r.device)[None, :]
    in_gen = (cols >= r.P[:, None]) & (cols < r.L[:, None])
    masked = (r.x == r.mask_id) & in_gen
    block_open = (masked & (cols >= s[:, None]) & (cols < e[:, None])).any(-1)
    # contiguous committed prefix of the answer: up to the first mask (or the end)
    first_mask = torch.where(masked.any(-1), masked.int().argmax(-1), r.L)
    prefix = first_mask - r.P
    revising = r.max_post >= 0
    r.post = torch.where(run & revising & ~had_mask, r.post + 1, r.post)
    hold = revising & (r.max_post > 0) & (had_mask | ((edits > 0) & (r.post < r.max_post)))
    block_done = run & ~block_open & ~hold
    last_block = e >= r.L
    has_stop, stop_at = first_stop(r.x, r.stop_ids, in_gen, r.L)
    stopped = has_stop & (first_mask > stop_at)  # end of text committed, nothing masked before it
    stopped = stopped & (~revising | block_done | (stop_at < s))
    done = run & ((block_done & last_block) | (stopped & r.early))
    nxt = block_done & ~done
    again = torch.zeros_like(run) if restart is None else restart & run & ~block_done
    r.step = torch.where(run & ~block_done & ~again, r.step + 1, torch.where(again, 0, r.step))
    r.age = torch.where(run, r.age + 1, r.age)
    r.block = torch.where(nxt, r.block + 1, r.block)
    r.s, r.e = torch.where(nxt, e, s), torch.where(nxt, torch.minimum(e + r.blk, r.L), e)
    r.step = torch.where(nxt, torch.zeros_like(r.step), r.step)
    r.post = torch.where(nxt, torch.zeros_like(r.post), r.post)
    final = torch.where(done, r.L, r.s) - r.P  # a revising row's tokens are final before its open block
    prefix = torch.where(revising, torch.minimum(prefix, final), prefix)
    stuck = run & block_open & (committed == 0) & (remasked == 0)
    r.start_blocks(nxt | again)
    # the tokens the committed prefix can have grown by lie in the block that was open: [s, s + W)
    block = r.x.gather(1, (s[:, None] + torch.arange(w.W, device=r.device)[None, :]).clamp(max=r.cap))
    info = torch.stack([run.long(), committed, prefix, done.long(), stuck.long(), w.seal.long(), w.redo.long(),
                        edits, remasked, s - r.P, r.L - r.P], 1)
    return torch.cat([torch.cat([info, block], 1).flatten(), w.counts().flatten()])


def report(rows: RowState, work: StepWork, flat: list[int], shown: dict | None = None) -> Report:
    """The step's Report from `settle`'s values as read (host ints); `shown`: watched rows'
    proposals this step (engine/commit.py Committer.shown)."""
    r, W = rows, work.W
    width = 11 + W
    info = [flat[i * width : (i + 1) * width] for i in range(r.n)]
    rest = flat[r.n * width :]
    out = Report(records=work.finish_records([rest[i : i + 3] for i in range(0, len(rest), 3)]))
    # whole rows only for those that finished or are watched (the playground), or, never expected,
    # a prefix that grew outside the open block
    show = [i for i, row in enumerate(info) if row[3] or r.reqs[i].watch
            or (row[0] and row[2] > r.reqs[i].committed and (r.reqs[i].committed < row[9] or row[2] > row[9] + W))]
    rows_x = dict(zip(show, r.x[show].tolist())) if show else {}
    for i, (req, row_info) in enumerate(zip(r.reqs, info)):
        ran, n, pre, fin, bad, ckv, again, ed, rm, start, length = row_info[:11]
        if bad:
            raise RuntimeError(f"request {req.id}: a step committed nothing while its block is open (policy bug)")
        if not ran:
            continue
        row, P = rows_x.get(i), len(req.prompt)
        if pre <= req.committed:
            new_ids = []
        elif row is not None:
            new_ids = row[P + req.committed : P + pre]
        else:  # from the open block's tokens (answer positions start .. start + W)
            new_ids = row_info[11 + req.committed - start : 11 + pre - start]
        # a doubted cached step ran twice: its window, then its recomputation
        out.row(i, pre, new_ids, 1 + again, [0, n] if again else [n], bool(fin), MaskedStats(ckv, ed, rm))
        if req.watch:
            out.views[i] = (row[P : P + length], None, (shown or {}).get(i, {}))
        if fin:
            out.answers[i] = row[P : P + length]
    return out


@dataclass
class MaskedStats(Stats):
    """A masked row's own counters."""

    seal_forwards: int = 0  # forwards that also wrote a finished block's exact K/V (block models)
    edits: int = 0  # committed tokens its policy replaced (token-to-token editing)
    remasked: int = 0  # committed tokens its policy masked again (remasking)
