"""LLaDA2.1's own block generation (the `generate` of its published model code,
modeling_llada2_moe.py), reproduced token for token and forward for forward (`compat llada2`).

The reference decodes one prompt at a time; this loop runs a batch of them side by side, each row
exactly as if alone:
- the canvas of a row is its prompt, then MASK through the end of its last block: blocks of
  `block_length` counted from position 0, `ceil((prompt + gen_length) / block_length)` of them, the
  first being the block that holds the prompt's end; positions start at 0 for every row, so rows
  of unequal prompts need no padding mask (the attention is block-causal: a block never sees a
  later one, and a row's columns past its own window are later blocks);
- a forward covers the canvas up to the end of the row's current block (here the batch's widest
  window; block-causality makes the extra columns invisible to each row's block);
- per forward and row, greedy proposals over the block (argmax and its softmax probability);
  mask-to-token: the masked positions with probability strictly above `threshold`, if at least
  one (upstream's num_to_transfer, 1) qualifies, else the most probable masked position
  (torch.topk); token-to-token: every unmasked non-prompt position of the block whose argmax
  differs from its token with probability strictly above `edit_threshold`; both are written;
- post steps: once a block has no mask, each further iteration counts a post step, and past
  `max_post_steps` the block ends without a forward; a forward that finds no mask and makes no
  edit also ends it;
- after a block, with `early_stop` (upstream's eos_early_stop): the row stops when its generated
  region up to the block's end holds no MASK and holds the end-of-text token;
- the result is the generated region up to `gen_length`, cut after the first end-of-text token.
Greedy only (its temperature-0 path). Where the model's argmax is MASK itself, upstream writes
MASK back and loops forever; here the most probable other token is taken. The one change to run it on a float32 CPU model: upstream
builds its additive block mask in bfloat16, which SDPA refuses beside float32 queries; here the
mask is boolean (the same attention). Checked against the reference's recorded output
(tests/test_llada2_upstream.py) and against a line-by-line port (tests/reference.py).
"""

import time

import torch

from unmask.errors import UnmaskError
from unmask.models.base import DiffusionLM, TokenIds
from unmask.params import GenerationParams
from unmask.trace import Decoded, ForwardRecord


@torch.inference_mode()
def decode_llada2(model: DiffusionLM, tokens: TokenIds, prompts: list[list[int]], params: GenerationParams) -> Decoded:
    if model.config.logit_shift:
        raise UnmaskError("compat 'llada2' needs a model without token shift (LLaDA2.x scores each position's own token)")
    device = next(model.parameters()).device
    B, bl, G = len(prompts), params.block_length, params.gen_length
    mask, eos = tokens.mask, tokens.eos
    thr, edit_thr = params.threshold, params.edit_threshold if params.edit_threshold is not None else 1.0
    max_post = params.max_post_steps
    lens = torch.tensor([len(p) for p in prompts], device=device)
    nblocks = (lens + G + bl - 1) // bl
    width = int(nblocks.max()) * bl
    x = torch.full((B, width), mask, dtype=torch.long, device=device)
    for r, p in enumerate(prompts):  # host-side setup, once per batch
        x[r, : len(p)] = torch.tensor(p, device=device)
    pos = torch.arange(width, device=device)[None, :].expand(B, -1)
    blk_of = torch.arange(width, device=device) // bl
    causal = (blk_of[None, :] <= blk_of[:, None])[None, None]  # (1, 1, width, width): key block <= query block
    cur = lens // bl  # each row's current block
    post = torch.zeros(B, dtype=torch.long, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    nfe = torch.zeros(B, dtype=torch.long, device=device)
    inner = torch.arange(bl, device=device)[None, :]
    mask_ids = torch.tensor([mask], device=device)
    log_commit: list[torch.Tensor] = []
    log_edit: list[torch.Tensor] = []
    trace: list[ForwardRecord] = []

    def block_cols():
        return (cur * bl)[:, None] + inner  # (B, bl)

    def end_blocks(rows: torch.Tensor) -> None:
        """Rows whose current block just ended: stop (early stop, or the last block) or move on."""
        nonlocal cur, post, done
        if params.early_stop:
            cols = torch.arange(width, device=device)[None, :]
            gen = (cols >= lens[:, None]) & (cols < ((cur + 1) * bl)[:, None])
            clean = ~((x == mask) & gen).any(-1)
            has_eos = ((x == eos) & gen).any(-1)
            done = done | (rows & clean & has_eos)
        nxt = rows & ~done
        cur = torch.where(nxt, cur + 1, cur)
        post = torch.where(nxt, torch.zeros_like(post), post)
        done = done | (nxt & (cur >= nblocks))

    while True:
        # before the forward: a row whose block has no mask counts a post step; past the cap its
        # block ends without a forward (and the row's next block is checked the same way)
        need = ~done
        while True:
            cur_c = block_cols().clamp(max=width - 1)
            no_mask = ~(x.gather(1, cur_c) == mask).any(-1)
            post = torch.where(need & no_mask, post + 1, post)
            over = need & no_mask & (post > max_post)
            if not bool(over.any()):
                break
            end_blocks(over)
            need = over & ~done
        run = ~done
        if not bool(run.any()):
            break
        idx = run.nonzero().squeeze(-1)
        t0 = time.perf_counter()
        W = int(((cur[idx] + 1) * bl).max())
        cols = block_cols()[idx]  # (R, bl)
        logits = model(x[idx, :W], pos[idx, :W], attn_mask=causal[:, :, :W, :W], logits_slice=cols)
        nfe[idx] += 1
        probs = torch.softmax(logits.float(), -1)
        p, tok = probs.max(-1)  # greedy: the argmax and its probability
        # where MASK itself is the argmax upstream commits MASK and never finishes; the best other token
        p2, tok2 = probs.index_fill(-1, mask_ids, -1.0).max(-1)
        p, tok = torch.where(tok == mask, p2, p), torch.where(tok == mask, tok2, tok)
        old = x[idx].gather(1, cols)
        masked = old == mask
        prompt = cols < lens[idx, None]
        conf = torch.where(masked, p, -torch.inf)
        high = (conf > thr) & masked
        fallback = torch.zeros_like(masked)
        fallback[torch.arange(idx.numel(), device=device), torch.topk(conf, 1, dim=-1).indices[:, 0]] = True
        commit = torch.where(high.any(-1, keepdim=True), high, fallback & masked)
        edit = ~masked & ~prompt & (p > edit_thr) & (tok != old)
        write = commit | edit
        x[idx] = x[idx].scatter(1, cols, torch.where(write, tok, old))
        n_commit, n_edit = commit.sum(-1), edit.sum(-1)
        full = torch.full((B,), -1, dtype=torch.long, device=device)
        log_commit.append(full.index_copy(0, idx, n_commit))
        log_edit.append(full.index_copy(0, idx, n_edit))
        trace.append(ForwardRecord("full", idx.numel(), W, n_commit.sum(), time.perf_counter() - t0,
                                   edits=n_edit.sum()))
        # after the forward: a block that had no mask and saw no edit ends
        ended = torch.zeros(B, dtype=torch.bool, device=device)
        ended[idx] = ~masked.any(-1) & (n_edit == 0)
        if bool(ended.any()):
            end_blocks(ended)
    for rec in trace:
        rec.committed, rec.edits = int(rec.committed), int(rec.edits)
    commits = torch.stack(log_commit, 0).T.tolist() if log_commit else [[] for _ in range(B)]
    edits = torch.stack(log_edit, 0).T.tolist() if log_edit else [[] for _ in range(B)]
    rows = x.tolist()
    out = []
    for r, p in enumerate(prompts):
        gen = rows[r][len(p) : len(p) + G]
        if eos in gen:
            gen = gen[: gen.index(eos) + 1]
        out.append(gen)
    return Decoded(out, nfe.tolist(), [[n for n in row if n >= 0] for row in commits], trace, "none",
                   max(map(len, prompts)), row_edits=[[n for n in row if n >= 0] for row in edits])
