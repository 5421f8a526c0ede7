"""The references' own lockstep loop (LLaDA, Fast-dLLM v1, Dream; `compat` modes): one batch of
left-padded prompts, blocks left to right in lockstep, each step one forward, one proposal, one
commit, exactly as the reference samplers do it. Everything inside a step is batched tensor
code; the only host sync per step is one small read that decides whether the block is done and
whether rows finished. Native decoding never runs here (unmask.engine)."""

import time
from dataclasses import dataclass

import torch

from unmask.kv.static import StaticKV
from unmask.models.base import DiffusionLM, TokenIds
from unmask.params import GenerationParams
from unmask.canvas import Canvas, finished_rows, retire_rows
from unmask.compat import get_mode
from unmask.sampler.proposal import propose
from unmask.trace import Decoded, ForwardRecord


@dataclass(frozen=True)
class Window:
    """The columns one reference step recomputes."""

    start: int
    end: int
    use_kv: bool  # read/write the KV buffer (False: a plain full forward)
    refresh: bool  # the whole canvas is recomputed (exact logits)


def reference_window(cache: str, refresh_interval: int | None, step: int, s: int, e: int, length: int,
                     shift: int) -> Window:
    """Fast-dLLM v1's caches as its `generate_with_prefix_cache` / `generate_with_dual_cache` run
    them: a refresh of the whole canvas at the block start (and every `refresh_interval` steps),
    otherwise [s, L) (prefix) or [s, e) (dual) against the cached K/V; no cache: the canvas."""
    if cache == "none":
        return Window(0, length, False, True)
    if step == 0 or (refresh_interval is not None and step % refresh_interval == 0):
        return Window(0, length, True, True)
    return Window(s - shift, length if cache == "prefix" else e, True, False)


def _forward(model: DiffusionLM, c: Canvas, kv: StaticKV | None, w: Window, lo: int, e: int, full: bool):
    """Logits for token columns [lo, e), or for the whole window when `full` (then aligned so that
    entry j of the window scores window column j, as the references see it)."""
    shift = model.config.logit_shift
    ids, pos = c.x[:, w.start : w.end], c.positions[:, w.start : w.end]
    kv_in = kv if w.use_kv else None
    if not full:
        return model(ids, pos, kv_in, w.start, c.key_mask, slice(lo - shift - w.start, e - shift - w.start))
    logits = model(ids, pos, kv_in, w.start, c.key_mask, None)
    if shift:
        logits = torch.cat([logits[:, :shift], logits[:, :-shift]], dim=1)
    return logits


class _Decoder:
    """State of one batch through the loop: canvas, KV buffer, trace."""

    def __init__(self, model: DiffusionLM, tokens: TokenIds, prompts: list[list[int]], params: GenerationParams,
                 suffixes: list[list[int]] | None = None) -> None:
        mode = get_mode(params.compat)
        self.model, self.params, self.rules = model, params, mode.rules
        self.proposal, self.policy, self.schedule = mode.parts(params, tokens.mask)
        device = next(model.parameters()).device
        self.mask = tokens.mask
        pad = tokens.pad if tokens.pad is not None else tokens.eos
        self.c = Canvas.build(prompts, params.gen_length, self.mask, pad, device, suffixes)
        self.out = self.c.x.clone()
        self.stop_ids = torch.tensor(tokens.stop, device=device)
        self.gen = torch.Generator(device).manual_seed(params.seed) if params.seed is not None else None
        self.kv = StaticKV(model.config.num_layers, self.c.length) if params.cache != "none" else None
        self.row_nfe = torch.zeros(self.c.batch, dtype=torch.long, device=device)
        self.commit_log: list[torch.Tensor] = []
        self.steps: list[ForwardRecord] = []

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
        return Decoded(self.out[:, P : c.region_end].tolist(), self.row_nfe.tolist(), row_commits, self.steps, self.params.cache, P)

    def block(self, b: int, s: int, e: int) -> None:
        self.schedule.start_block((self.c.x[:, s:e] == self.mask).sum(-1))
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
        c, rules, mask, p = self.c, self.rules, self.mask, self.params
        P = c.prompt_len
        w = reference_window(p.cache, p.refresh_interval, i, s, e, c.length, self.model.config.logit_shift)
        lo = P if (w.refresh and rules.candidates_before_block_end) else s
        logits = _forward(self.model, c, self.kv, w, lo, e, rules.score_full_window)
        prop = propose(logits, self.proposal, self.gen)
        cand = c.x[:, lo:e] == mask
        quota = self.schedule.quota(i, cand.sum(-1)) if self.policy.uses_schedule else None
        if rules.score_full_window:  # select over the reference's row: the whole recomputed window
            a, z = lo - w.start, e - w.start
            wide = torch.zeros_like(prop.tokens, dtype=torch.bool)
            wide[:, a:z] = cand
            commit = self.policy.select(prop.score, prop.entropy, wide, quota, i, self.gen)[:, a:z]
            tokens = prop.tokens[:, a:z]
        else:
            commit = self.policy.select(prop.score, prop.entropy, cand, quota, i, self.gen)
            tokens = prop.tokens
        c.x[:, lo:e] = torch.where(commit, tokens, c.x[:, lo:e])

        per_row = commit.sum(-1)
        logged = torch.full((self.out.shape[0],), -1, dtype=torch.long, device=per_row.device)
        self.commit_log.append(logged.index_copy_(0, c.rows, per_row))
        self.row_nfe.index_add_(0, c.rows, torch.ones_like(c.rows))
        still_open = (c.x[:, s:e] == mask).any(-1)
        done = finished_rows(c.x[:, P : c.region_end], mask, self.stop_ids) if rules.early_stop else torch.zeros_like(still_open)
        any_open, any_done, n_committed = torch.stack([still_open.any(), done.any(), per_row.sum()]).tolist()
        self.steps.append(ForwardRecord("full" if w.refresh else "window", c.batch, w.end - w.start, int(n_committed),
                                        block=b))
        if any_done:
            keep = retire_rows(c, self.out, done, self.schedule, self.kv)
            any_open = bool(still_open[keep].any()) if c.batch else False
        return bool(any_open), n_committed > 0


@torch.inference_mode()
def decode_reference(model: DiffusionLM, tokens: TokenIds, prompts: list[list[int]], params: GenerationParams,
                     suffixes: list[list[int]] | None = None) -> Decoded:
    """Decode a batch of tokenised prompts as the reference of `params.compat` does (params
    accepted: unmask.engine.accept); with `suffixes`, on the canvas prompt + masks + suffix, as the
    reference decodes whatever canvas it is given (infilling)."""
    return _Decoder(model, tokens, prompts, params, suffixes).run()
