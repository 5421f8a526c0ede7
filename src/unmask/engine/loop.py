"""The denoising loop: blocks left to right; each step is one forward (NFE), one proposal, one
commit. Everything inside a step is batched tensor code; the only host sync per step is a single
small tensor read that decides whether the block is done and whether rows finished."""

import time
from dataclasses import dataclass, field

import torch

from unmask.cache.kv import StaticKV
from unmask.cache.policy import ForwardPlan
from unmask.engine.canvas import Canvas, finished_rows
from unmask.engine.setup import DecodeParts, build_parts
from unmask.models.base import DiffusionLM, TokenIds
from unmask.params import GenerationParams
from unmask.sampler.proposal import Proposal, propose


@dataclass(frozen=True)
class StepRecord:
    block: int
    rows: int  # rows in the forward
    positions: int  # canvas columns recomputed per row
    refresh: bool  # full-canvas forward
    committed: int  # tokens committed over all rows
    seconds: float


@dataclass
class Decoded:
    """Raw result of one batch: the final canvases and the trace."""

    canvas: torch.Tensor  # (B, P + G) final tokens per original row (MASK where never committed)
    prompt_len: int
    row_nfe: list[int]  # forwards each row took part in
    row_commits: list[list[int]]  # tokens committed per step, per row (steps the row was active)
    steps: list[StepRecord] = field(default_factory=list)
    cache: str = "none"

    @property
    def generated(self) -> torch.Tensor:
        return self.canvas[:, self.prompt_len :]

    @property
    def nfe(self) -> int:
        return len(self.steps)


def _forward(model: DiffusionLM, c: Canvas, kv: StaticKV | None, plan: ForwardPlan, lo: int, e: int, full: bool):
    """Logits for token columns [lo, e), or for the whole window when `full` (then aligned so that
    entry j of the window scores window column j, as the references see it)."""
    shift = model.config.logit_shift
    qs, qe = plan.start, plan.end
    ids, pos = c.x[:, qs:qe], c.positions[:, qs:qe]
    kv_in = kv if plan.use_kv else None
    if not full:
        return model(ids, pos, kv_in, qs, c.key_mask, slice(lo - shift - qs, e - shift - qs))
    logits = model(ids, pos, kv_in, qs, c.key_mask, None)
    if shift:
        logits = torch.cat([logits[:, :shift], logits[:, :-shift]], dim=1)
    return logits


def _slice(p: Proposal, a: int, b: int) -> Proposal:
    ent = None if p.entropy is None else p.entropy[:, a:b]
    return Proposal(p.tokens[:, a:b], p.score[:, a:b], ent)


@torch.inference_mode()
def decode(
    model: DiffusionLM,
    tokens: TokenIds,
    prompts: list[list[int]],
    params: GenerationParams,
    parts: DecodeParts | None = None,
) -> Decoded:
    """Decode a batch of tokenised prompts. `params` must already be checked."""
    parts = parts or build_parts(params, tokens)
    device = next(model.parameters()).device
    mask = tokens.mask
    pad = tokens.pad if tokens.pad is not None else tokens.eos
    c = Canvas.build(prompts, params.gen_length, mask, pad, device)
    P, L, B0 = c.prompt_len, c.length, c.batch
    out = c.x.clone()
    stop_ids = torch.tensor(sorted(set(tokens.stop) | {tokens.eos}), device=device)
    gen = torch.Generator(device).manual_seed(params.seed) if params.seed is not None else None
    kv = StaticKV(model.config.num_layers, L) if parts.cache.stores_kv else None
    rules, shift = parts.rules, model.config.logit_shift
    row_nfe = torch.zeros(B0, dtype=torch.long, device=device)
    commit_log: list[torch.Tensor] = []
    steps: list[StepRecord] = []

    for b in range(params.num_blocks):
        if c.batch == 0:
            break
        s = P + b * params.block_length
        e = s + params.block_length
        parts.schedule.start_block((c.x[:, s:e] == mask).sum(-1))
        i = 0
        while True:
            t0 = time.perf_counter()
            plan = parts.cache.plan(i, s, e, L, shift)
            lo = P if (plan.refresh and rules.candidates_before_block_end) else s
            logits = _forward(model, c, kv, plan, lo, e, rules.score_full_window)
            prop = propose(logits, parts.proposal, gen)
            if rules.score_full_window:
                prop = _slice(prop, lo - plan.start, e - plan.start)
            cand = c.x[:, lo:e] == mask
            quota = parts.schedule.quota(i, cand.sum(-1)) if parts.policy.uses_schedule else None
            commit = parts.policy.select(prop.score, prop.entropy, cand, quota, i, gen)
            c.x[:, lo:e] = torch.where(commit, prop.tokens, c.x[:, lo:e])
            i += 1

            per_row = commit.sum(-1)
            logged = torch.full((B0,), -1, dtype=torch.long, device=device)
            commit_log.append(logged.index_copy_(0, c.rows, per_row))
            row_nfe.index_add_(0, c.rows, torch.ones_like(c.rows))
            still_open = (c.x[:, s:e] == mask).any(-1)
            if rules.early_stop:
                done = finished_rows(c.x[:, P:], mask, stop_ids)
            else:
                done = torch.zeros_like(still_open)
            flags = torch.stack([still_open.any(), done.any(), per_row.sum() > 0, per_row.sum()]).tolist()
            any_open, any_done, progressed, n_committed = bool(flags[0]), bool(flags[1]), bool(flags[2]), flags[3]
            steps.append(StepRecord(b, c.batch, plan.end - plan.start, plan.refresh, int(n_committed), 0.0))
            if any_done:
                out[c.rows[done]] = c.x[done]
                keep = (~done).nonzero().squeeze(-1)
                c.select(keep)
                parts.schedule.select_rows(keep)
                if kv is not None:
                    kv.select_rows(keep)
                any_open = bool(still_open[keep].any()) if c.batch else False
            steps[-1] = _timed(steps[-1], time.perf_counter() - t0)
            if rules.run_all_steps:
                if i >= params.steps_per_block:
                    break
            elif not any_open or c.batch == 0:
                break
            elif not progressed:
                raise RuntimeError("decode step committed nothing while the block is open (policy bug)")

    if c.batch:
        out[c.rows] = c.x
    log = torch.stack(commit_log, 0).T.tolist() if commit_log else [[] for _ in range(B0)]
    row_commits = [[n for n in row if n >= 0] for row in log]
    return Decoded(out.cpu(), P, row_nfe.tolist(), row_commits, steps, parts.cache.name)


def _timed(r: StepRecord, seconds: float) -> StepRecord:
    return StepRecord(r.block, r.rows, r.positions, r.refresh, r.committed, seconds)
