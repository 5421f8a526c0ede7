"""Fast-dLLM v2's `batch_sample`, reproduced token for token and forward for forward
(`compat fast-dllm-v2`; reference-semantics.md §7 and §7.1).

This is the reference's own lockstep loop, kept apart from the request engine (which runs block
models natively, with the seal forward fused into the next block's first step). What it
reproduces:
- prompts right-padded with MASK to the longest: the padding of shorter prompts is generated too,
  and a row gets `gen_length // B + longest // B` blocks counted from position 0;
- a prefill of the largest multiple of B within the shortest prompt; when the shortest prompt
  ends on a block boundary, the prefill's last logit proposes the next token of those rows;
- blocks of B (the model's bd_size) decoded in sub-blocks of `block_length` (small_block_size),
  left to right; inside the block logits are shifted by one (its first position keeps its own);
  each step commits, per row, the open positions of the sub-block with probability strictly
  above the threshold, and that row's most probable open position;
- `use_block_cache` (cache "exact-dual"): a whole-block forward when any row has MASK at the
  sub-block's first position (or the block has no cache yet), otherwise only the sub-block
  against the block's K/V; without it (cache "exact") the whole block every step;
- stop handling: a row is finished once a denoising step commits the stop token; the block is
  still completed for every row; then finished rows are padded after their first stop token,
  and unless every row finished, one seal forward writes the block's exact K/V and its last
  logit's argmax becomes the next block's first token (pad, the tokenizer's pad id, for finished
  rows; which other rows take it follows how upstream writes the block back into its `input_ids`,
  see below); finished rows then leave the batch. Stop tokens proposed by a prefill or commit
  forward are not detected.
Checked against upstream's recorded output (tests/test_fast_dllm_v2_upstream.py, 40 batches).
The per-step work is batched tensor code with one host read per step, as in the other loops.
"""

import time

import torch

from unmask.kv.static import StaticKV
from unmask.errors import UnmaskError
from unmask.models.base import DiffusionLM, TokenIds
from unmask.params import GenerationParams
from unmask.sampler.stops import first_stop
from unmask.trace import Decoded, ForwardRecord


@torch.inference_mode()
def decode_fast_dllm_v2(model: DiffusionLM, tokens: TokenIds, prompts: list[list[int]],
                        params: GenerationParams) -> Decoded:
    bs, sub = model.config.block_size, params.block_length
    if not bs or model.config.logit_shift != 1:
        raise UnmaskError("compat 'fast-dllm-v2' needs a block-diffusion model with token shift (Fast-dLLM v2)")
    if bs % sub:
        raise UnmaskError(f"compat 'fast-dllm-v2': block_length {sub} (small_block_size) must divide the model's "
                          f"block of {bs}")
    if params.gen_length < bs:
        raise UnmaskError(f"compat 'fast-dllm-v2': gen_length {params.gen_length} must be at least the block, {bs}")
    if min(map(len, prompts)) == bs:
        raise UnmaskError(f"compat 'fast-dllm-v2': the shortest prompt is exactly one block ({bs} tokens); the "
                          "reference then skips the prefill and decodes without the prompt (it prefills only "
                          "prompts longer than a block)")
    device = next(model.parameters()).device
    mask, stop = tokens.mask, tokens.eos
    stop_ids = torch.tensor([stop], device=device)
    pad = tokens.pad if tokens.pad is not None else tokens.eos
    lens = torch.tensor([len(p) for p in prompts], device=device)
    B, min_len, max_len = len(prompts), min(map(len, prompts)), max(map(len, prompts))
    num_blocks = params.gen_length // bs + max_len // bs
    width = num_blocks * bs + 1  # each block's seal forward appends the next block's first token
    x = torch.full((B, width), mask, dtype=torch.long, device=device)
    for r, p in enumerate(prompts):  # host-side setup, once per batch
        x[r, : len(p)] = torch.tensor(p, device=device)
    pos = torch.arange(width, device=device)[None, :].expand(B, -1)
    kv = StaticKV(model.config.num_layers, width)
    rows = torch.arange(B, device=device)  # original index of each row still in the batch
    out: dict[int, list[int]] = {}
    nfe = torch.zeros(B, dtype=torch.long, device=device)
    log: list[torch.Tensor] = []
    trace: list[ForwardRecord] = []
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    use_block_cache = params.cache == "exact-dual"

    def record(kind: str, q: int, committed: torch.Tensor | None, t0: float) -> None:
        nfe.index_add_(0, rows, torch.ones_like(rows))
        per_row = committed if committed is not None else torch.zeros_like(rows)
        log.append(torch.full((B,), -1, dtype=torch.long, device=device).index_copy_(0, rows, per_row))
        trace.append(ForwardRecord(kind, rows.numel(), q, per_row.sum(), time.perf_counter() - t0,
                                   rows.numel() if kind == "seal" else 0))

    # the width of upstream's `input_ids` (the right-padded prompts, then the canvas through the
    # last block's trailing token): it decides which rows take a seal forward's next token
    width_in = max_len + (min_len == max_len and min_len % bs == 0)
    prefill = min_len // bs * bs
    if prefill:
        t0 = time.perf_counter()
        last = model(x[:, :prefill], pos[:, :prefill], kv, 0, None, slice(prefill - 1, prefill))[:, -1]
        if min_len % bs == 0:  # the prefill proposes the next token of the shortest prompts
            x[:, min_len] = torch.where(lens == min_len, last.argmax(-1), x[:, min_len])
        record("full", prefill, None, t0)
    for b in range(prefill // bs, num_blocks):
        s0, e0 = b * bs, (b + 1) * bs
        block_cache = False
        for ss in range(s0, e0, sub):
            se = ss + sub
            while True:
                open_ = x[:, ss:se] == mask
                any_open, first_open = torch.stack([open_.any(), open_[:, 0].any()]).tolist()
                if not any_open:
                    break
                t0 = time.perf_counter()
                if use_block_cache and block_cache and not first_open:  # the sub-block against the block cache
                    logits = model(x[:, ss:se], pos[:, ss:se], kv, ss, None, None)
                    logits = torch.cat([logits[:, :1], logits[:, :-1]], 1)
                    q = sub
                else:  # the whole block
                    logits = model(x[:, s0:e0], pos[:, s0:e0], kv, s0, None, None)
                    logits = torch.cat([logits[:, :1], logits[:, :-1]], 1)[:, ss - s0 : se - s0]
                    block_cache, q = use_block_cache, bs
                p, tok = torch.softmax(logits, -1).max(-1)
                conf = torch.where(open_, p, -torch.inf)
                commit = conf > params.threshold
                commit[torch.arange(commit.shape[0], device=device), conf.argmax(-1)] = True
                commit &= open_
                x[:, ss:se] = torch.where(commit, tok, x[:, ss:se])
                finished |= (commit & (tok == stop)).any(-1)
                record("window", q, commit.sum(-1), t0)
        cols = torch.arange(width, device=device)[None, :]
        _, stop_at = first_stop(x, stop_ids, cols >= lens[:, None])  # the first stop after the prompt
        x = torch.where(finished[:, None] & (cols > stop_at[:, None]), pad, x)
        if bool(finished.all()):
            e_out = e0
            break
        t0 = time.perf_counter()  # the seal forward: exact K/V of the block, and the next block's first token
        last = model(x[:, s0:e0], pos[:, s0:e0], kv, s0, None, slice(bs - 1, bs))[:, -1]
        # which rows take the next token, as upstream writes x_t back into input_ids: every row when
        # every prompt ends in this block or input_ids is no wider than this block plus one (then
        # `input_ids = x_t`, which also overwrites the prompt token at e0 of a row whose prompt is
        # exactly one token longer, and fills e0 of a row whose prompt ends on the boundary);
        # otherwise only the rows whose prompt ends in this block (the others keep input_ids[:, e0]:
        # their prompt token, or MASK for a prompt that ends on the boundary)
        ends_here = lens // bs <= b
        if bool(ends_here.all()) or width_in <= e0 + 1:
            ends_here = torch.ones_like(ends_here)
            width_in = e0 + 1
        x[:, e0] = torch.where(finished, pad, torch.where(ends_here, last.argmax(-1), x[:, e0]))
        record("seal", bs, None, t0)
        e_out = e0 + 1
        if bool(finished.any()):
            gone = finished.nonzero().squeeze(-1).tolist()
            for r, row in zip(gone, x[gone, :e_out].tolist()):
                out[int(rows[r])] = row
            keep = (~finished).nonzero().squeeze(-1)
            x, pos, lens, rows, finished = x[keep], pos[keep], lens[keep], rows[keep], finished[keep]
            kv.select_rows(keep)
    for r, row in zip(rows.tolist(), x[:, :e_out].tolist()):
        out[r] = row
    steps_log = torch.stack(log, 0).T.tolist() if log else [[] for _ in range(B)]
    for rec in trace:
        rec.committed = int(rec.committed)
    return Decoded([out[r][len(prompts[r]):] for r in range(B)], nfe.tolist(),
                        [[n for n in row if n >= 0] for row in steps_log], trace, params.cache, max_len)
