"""After a step's forwards: blocks advance, stops are found, finished rows leave, and each
request's record and stream output are brought up to date."""

import time

import torch

from unmask.engine.request import Request, StepOutput
from unmask.engine.rows import RowState
from unmask.sampler.stops import first_stop


def advance(rows: RowState, run: torch.Tensor, s: torch.Tensor, e: torch.Tensor, committed: torch.Tensor,
            seal: torch.Tensor, redo: torch.Tensor, mask_id: int, stop_ids: torch.Tensor,
            finish, had_mask: torch.Tensor, edits: torch.Tensor, remasked: torch.Tensor) -> list[StepOutput]:
    """Per-row bookkeeping in tensors, then one transfer for the rows whose committed prefix grew.
    `finish(req, canvas)` is called for each request that finished this step (its rows left).

    A revising policy's block (rows with max_post >= 0) stays open after its last mask: the next
    steps are post steps, up to max_post of them, and the first post step that edits nothing ends
    it. Its tokens are final only once the block ends: the streamed prefix stops at the open
    block, and an end of text stops the row only in a finished block."""
    r = rows
    cols = torch.arange(r.cap + 1, device=r.device)[None, :]
    in_gen = (cols >= r.P[:, None]) & (cols < r.L[:, None])
    masked = (r.x == mask_id) & in_gen
    block_open = (masked & (cols >= s[:, None]) & (cols < e[:, None])).any(-1)
    # contiguous committed prefix of the answer: up to the first mask (or the end)
    first_mask = torch.where(masked.any(-1), masked.int().argmax(-1), r.L)
    prefix = first_mask - r.P
    revising = r.max_post >= 0
    r.post = torch.where(run & revising & ~had_mask, r.post + 1, r.post)
    hold = revising & (r.max_post > 0) & (had_mask | ((edits > 0) & (r.post < r.max_post)))
    block_done = run & ~block_open & ~hold
    last_block = e >= r.L
    has_stop, stop_at = first_stop(r.x, stop_ids, in_gen, r.L)
    stopped = has_stop & (first_mask > stop_at)  # end of text committed, nothing masked before it
    stopped = stopped & (~revising | block_done | (stop_at < s))
    done = run & ((block_done & last_block) | (stopped & r.early))
    nxt = block_done & ~done
    r.step = torch.where(run & ~block_done, r.step + 1, r.step)
    r.age = torch.where(run, r.age + 1, r.age)
    r.block = torch.where(nxt, r.block + 1, r.block)
    r.s, r.e = torch.where(nxt, e, s), torch.where(nxt, torch.minimum(e + r.blk, r.L), e)
    r.step = torch.where(nxt, torch.zeros_like(r.step), r.step)
    r.post = torch.where(nxt, torch.zeros_like(r.post), r.post)
    if bool(nxt.any()):
        r.start_blocks(nxt.nonzero().squeeze(-1))
    final = torch.where(done, r.L, r.s) - r.P  # a revising row's tokens are final before its open block
    prefix = torch.where(revising, torch.minimum(prefix, final), prefix)
    stuck = run & block_open & (committed == 0) & (remasked == 0)
    info = torch.stack([run.long(), committed, prefix, done.long(), stuck.long(), seal.long(), redo.long(),
                        edits, remasked], 1).tolist()
    grew = [i for i, (ran, _, pre, *_) in enumerate(info) if ran and (pre > r.reqs[i].committed or r.reqs[i].watch)]
    rows_x = dict(zip(grew, r.x[grew].tolist())) if grew else {}  # one transfer for every row that grew
    now = time.perf_counter()
    outputs = []
    for i, (req, (ran, n, pre, fin, bad, ckv, again, ed, rm)) in enumerate(zip(list(r.reqs), info)):
        if bad:
            raise RuntimeError(f"request {req.id}: a step committed nothing while its block is open (policy bug)")
        if ran:
            req.edits += ed
            req.remasked += rm
            outputs.append(_update(req, rows_x.get(i), n, pre, bool(fin), ckv, again, now))
    if bool(done.any()):
        gone = done.nonzero().squeeze(-1).tolist()
        rows_all = r.x[gone].tolist()
        reqs = list(r.reqs)
        r.keep((~done).nonzero().squeeze(-1))
        for i, row in zip(gone, rows_all):
            req = reqs[i]
            P = len(req.prompt)
            finish(req, row[P : P + req.params.gen_length])
    return outputs


def _update(req: Request, row: list[int] | None, n: int, pre: int, fin: bool, ckv: int, again: int,
            now: float) -> StepOutput:
    req.nfe += 1 + again  # a doubted cached step ran twice: its window, then its recomputation
    req.seal_forwards += ckv
    req.commits += [0, n] if again else [n]
    req.started = req.started or now
    new_ids, canvas = [], None
    if row is not None:
        P = len(req.prompt)
        if pre > req.committed:
            new_ids = row[P + req.committed : P + pre]
            req.first_commit = req.first_commit or now
            req.committed = pre
        if req.watch:
            canvas = row[P : P + req.params.gen_length]
    return StepOutput(req, pre, new_ids, fin, canvas)
