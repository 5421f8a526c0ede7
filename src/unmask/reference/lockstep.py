"""The denoising loop: blocks left to right; each step is one forward (NFE), one proposal, one
commit. Everything inside a step is batched tensor code; the only host sync per step is a single
small tensor read that decides whether the block is done and whether rows finished."""

import time
from dataclasses import dataclass, field

import torch

from unmask.cache.kv import StaticKV
from unmask.cache.policy import ForwardPlan
from unmask.engine.canvas import Canvas, finished_rows, retire_rows
from unmask.engine.parts import DecodeParts, build_parts
from unmask.models.base import DiffusionLM, TokenIds
from unmask.params import GenerationParams
from unmask.sampler.proposal import propose


@dataclass
class StepRecord:
    block: int
    rows: int  # rows in the forward
    positions: int  # canvas columns recomputed per row
    refresh: bool  # full-canvas forward
    committed: int  # tokens committed over all rows
    seconds: float = 0.0


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


class _Decoder:
    """State of one batch through the loop: canvas, KV buffer, trace."""

    def __init__(self, model: DiffusionLM, tokens: TokenIds, prompts: list[list[int]], params: GenerationParams,
                 parts: DecodeParts) -> None:
        self.model, self.params, self.parts, self.rules = model, params, parts, parts.rules
        device = next(model.parameters()).device
        self.mask = tokens.mask
        pad = tokens.pad if tokens.pad is not None else tokens.eos
        self.c = Canvas.build(prompts, params.gen_length, self.mask, pad, device)
        self.out = self.c.x.clone()
        self.stop_ids = torch.tensor(tokens.stop, device=device)
        self.gen = torch.Generator(device).manual_seed(params.seed) if params.seed is not None else None
        self.kv = StaticKV(model.config.num_layers, self.c.length) if parts.cache.stores_kv else None
        self.row_nfe = torch.zeros(self.c.batch, dtype=torch.long, device=device)
        self.commit_log: list[torch.Tensor] = []
        self.steps: list[StepRecord] = []

    def run(self) -> Decoded:
        P, blk = self.c.prompt_len, self.params.block_length
        for b in range(self.params.num_blocks):
            if self.c.batch == 0:
                break
            self.block(b, P + b * blk, P + (b + 1) * blk)
        c = self.c
        if c.batch:
            self.out[c.rows] = c.x
        B0 = self.out.shape[0]
        log = torch.stack(self.commit_log, 0).T.tolist() if self.commit_log else [[] for _ in range(B0)]
        row_commits = [[n for n in row if n >= 0] for row in log]
        return Decoded(self.out.cpu(), P, self.row_nfe.tolist(), row_commits, self.steps, self.parts.cache.name)

    def block(self, b: int, s: int, e: int) -> None:
        self.parts.schedule.start_block((self.c.x[:, s:e] == self.mask).sum(-1))
        i = 0
        while True:
            t0 = time.perf_counter()
            any_open, progressed = self.step(b, i, s, e)
            self.steps[-1].seconds = time.perf_counter() - t0
            i += 1
            if self.rules.run_all_steps:
                if i >= self.params.steps_per_block:
                    return
            elif not any_open or self.c.batch == 0:
                return
            elif not progressed:
                raise RuntimeError("decode step committed nothing while the block is open (policy bug)")

    def step(self, b: int, i: int, s: int, e: int) -> tuple[bool, bool]:
        """One forward, one proposal, one commit; then retire finished rows. One host sync."""
        c, parts, rules, mask = self.c, self.parts, self.rules, self.mask
        P = c.prompt_len
        plan = parts.cache.plan(i, s, e, c.length, self.model.config.logit_shift)
        lo = P if (plan.refresh and rules.candidates_before_block_end) else s
        logits = _forward(self.model, c, self.kv, plan, lo, e, rules.score_full_window)
        prop = propose(logits, parts.proposal, self.gen)
        cand = c.x[:, lo:e] == mask
        quota = parts.schedule.quota(i, cand.sum(-1)) if parts.policy.uses_schedule else None
        if rules.score_full_window:  # select over the reference's row: the whole recomputed window
            a, z = lo - plan.start, e - plan.start
            wide = torch.zeros_like(prop.tokens, dtype=torch.bool)
            wide[:, a:z] = cand
            commit = parts.policy.select(prop.score, prop.entropy, wide, quota, i, self.gen)[:, a:z]
            tokens = prop.tokens[:, a:z]
        else:
            commit = parts.policy.select(prop.score, prop.entropy, cand, quota, i, self.gen)
            tokens = prop.tokens
        c.x[:, lo:e] = torch.where(commit, tokens, c.x[:, lo:e])

        per_row = commit.sum(-1)
        logged = torch.full((self.out.shape[0],), -1, dtype=torch.long, device=per_row.device)
        self.commit_log.append(logged.index_copy_(0, c.rows, per_row))
        self.row_nfe.index_add_(0, c.rows, torch.ones_like(c.rows))
        still_open = (c.x[:, s:e] == mask).any(-1)
        done = finished_rows(c.x[:, P:], mask, self.stop_ids) if rules.early_stop else torch.zeros_like(still_open)
        any_open, any_done, n_committed = torch.stack([still_open.any(), done.any(), per_row.sum()]).tolist()
        self.steps.append(StepRecord(b, c.batch, plan.end - plan.start, plan.refresh, int(n_committed)))
        if any_done:
            keep = retire_rows(c, self.out, done, parts.schedule, self.kv)
            any_open = bool(still_open[keep].any()) if c.batch else False
        return bool(any_open), n_committed > 0


@torch.inference_mode()
def decode(
    model: DiffusionLM,
    tokens: TokenIds,
    prompts: list[list[int]],
    params: GenerationParams,
    parts: DecodeParts | None = None,
) -> Decoded:
    """Decode a batch of tokenised prompts. `params` must already be checked."""
    return _Decoder(model, tokens, prompts, params, parts or build_parts(params, tokens)).run()
