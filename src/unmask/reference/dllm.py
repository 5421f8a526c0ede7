"""dllm's MDLM and BD3LM samplers (ZHZisZZ/dllm `dllm/core/samplers/{mdlm,bd3lm}.py`, with their
default LinearAlphaScheduler and `get_num_transfer_tokens`), reproduced token for token and forward
for forward (`compat dllm-mdlm`, `compat dllm-bd3lm`), on dllm's A2D models: greedy or sampled
(Gumbel noise at a temperature, with a seed), low-confidence or random remasking. Checked against what dllm's own code returned
(tests/test_dllm_upstream.py).

The schedule (`transfer_counts`): a block of n masks decoded in S steps commits, at step j,
round(m * (1 - s/t)) of the m still masked, t = (S - j) / S and s = (S - j - 1) / S, the ratio s/t
computed in float32 as the scheduler computes it and the product rounded half to even; steps
that would commit nothing are dropped (so a block may take fewer forwards than S), and rows with
fewer steps commit nothing at the others.

MDLM (`decode_mdlm`): each row is its prompt, then gen_length masks, then end-of-text up to the
longest row (left-aligned prompts; the padding is masked out of attention). Blocks of
`block_length` are counted from each row's own prompt end; the total steps are spread as
ceil(steps / blocks) per block. Each step is one forward over the whole canvas; per row, the
`k` most confident masks before its block's end are committed (torch.topk over the row).

BD3LM (`decode_bd3lm`): prompts are left-padded with the pad id so that they all end at the next
multiple of `block_length`. Each block starts with one forward over everything before it (its
K/V kept), then its steps run the block alone against those K/V. Attention runs in blocks of
`block_length` columns ("key block <= query block"), the pad id's columns excluded as queries
and keys, and positions count only non-pad tokens — so an end-of-text the model writes, when the
pad id is the end-of-text id (dllm sets pad = eos for tokenizers without a pad), is treated as
padding from the next block on. Decoding stops when every row has written end-of-text in a
finished block.

Infilling (`decode_mdlm` with suffixes): `MDLMSampler.infill` on prompt + masks + suffix (`_infill`).

`attn_implementation`: the BD3LM sampler hands the model a boolean (B, 1, T, T) mask. With
transformers' "sdpa" attention (its default, and dllm's) that masks; with "eager" attention the
boolean is *added* to the attention scores, so every key is attended and the allowed ones get
+1 — the behaviour of the recorded cases in shared/data/a2d-upstream. Both are reproduced. MDLM
hands the model a padding mask that transformers turns into additive -inf: the same either way.
"""

import math

import torch

from unmask.compat import topk_rows
from unmask.errors import UnmaskError
from unmask.kv.static import StaticKV
from unmask.models.base import DiffusionLM, TokenIds
from unmask.params import GenerationParams
from unmask.trace import Decoded, ForwardRecord

_COUNTS: dict[tuple[int, int], list[int]] = {}


def transfer_counts(n: int, steps: int) -> list[int]:
    """The tokens dllm's linear schedule commits at each step of a block of `n` masks (zero steps
    dropped)."""
    key = (n, steps)
    if key not in _COUNTS:
        left, out = torch.tensor(n, dtype=torch.int64), []
        for j in range(steps):
            t = torch.tensor((steps - j) / steps, dtype=torch.float32)
            s = torch.tensor((steps - j - 1) / steps, dtype=torch.float32)
            keep = ((1 - (1 - s)) / (1 - (1 - t))).item()  # LinearAlphaScheduler.reverse_mask_prob, float32
            k = torch.minimum(torch.round(left.to(torch.float64) * (1 - keep)).to(torch.int64), left)
            left = left - k
            if int(k):
                out.append(int(k))
            if int(left) == 0:
                break
        _COUNTS[key] = out
    return _COUNTS[key]


def _schedule(masks: torch.Tensor, steps: int, device) -> torch.Tensor:
    """(B,) mask counts of a block -> (B, effective steps) counts, rows padded with zeros."""
    per = [transfer_counts(n, steps) for n in masks.tolist()]  # one host read per block
    width = max(map(len, per), default=0)
    return torch.tensor([p + [0] * (width - len(p)) for p in per], dtype=torch.long, device=device).reshape(len(per),
                                                                                                             width)


def _propose(logits: torch.Tensor, params: GenerationParams, gen: torch.Generator | None) -> tuple[torch.Tensor,
                                                                                                  torch.Tensor]:
    """The samplers' token and score: `add_gumbel_noise` (float64 uniforms over the whole logits
    tensor, exp(logits) / (-log u) ** temperature; nothing drawn at temperature 0), then the
    argmax's softmax probability (low_confidence) or a float32 uniform per position (random)."""
    if params.temperature > 0:
        wide = logits.to(torch.float64)
        u = torch.rand(wide.shape, dtype=torch.float64, generator=gen, device=logits.device)
        x0 = (wide.exp() / (-torch.log(u)) ** params.temperature).argmax(-1)
    else:
        x0 = logits.argmax(-1)
    if params.remasking == "random":
        return x0, torch.rand(x0.shape, generator=gen, device=logits.device)
    return x0, torch.softmax(logits, dim=-1).gather(-1, x0[..., None]).squeeze(-1)


def _generator(params: GenerationParams, device) -> torch.Generator | None:
    """The batch's generator: seeded as `torch.manual_seed(seed)` seeds the samplers' draws."""
    return torch.Generator(device).manual_seed(params.seed) if params.seed is not None else None


def _check(params: GenerationParams, model: DiffusionLM, name: str) -> None:
    if model.config.logit_shift or model.config.causal or model.config.canvas_length:
        raise UnmaskError(f"compat {name!r} runs a masked diffusion model whose positions score their own tokens "
                          f"(dllm's A2D models); this {model.config.family} model is not one", param="compat")


@torch.inference_mode()
def decode_mdlm(model: DiffusionLM, tokens: TokenIds, prompts: list[list[int]], params: GenerationParams,
                suffixes: list[list[int]] | None = None) -> Decoded:
    _check(params, model, "dllm-mdlm")
    if suffixes is not None:
        return _infill(model, tokens, prompts, suffixes, params)
    device = next(model.parameters()).device
    mask, G, bs = tokens.mask, params.gen_length, params.block_length
    lens = torch.tensor([len(p) for p in prompts], device=device)
    B, T = len(prompts), max(map(len, prompts)) + G
    x = torch.full((B, T), tokens.eos, dtype=torch.long, device=device)
    for r, p in enumerate(prompts):  # host-side setup, once per batch
        x[r, : len(p)] = torch.tensor(p, dtype=torch.long, device=device)
    cols = torch.arange(T, device=device)[None, :]
    x = torch.where((cols >= lens[:, None]) & (cols < (lens + G)[:, None]), mask, x)
    key_mask = cols < (lens + G)[:, None]
    pos = cols.expand(B, -1)
    num_blocks = math.ceil(G / bs)
    steps = math.ceil(params.total_steps / num_blocks)
    gen = _generator(params, device)
    trace, commits = [], []
    for b in range(num_blocks):
        start = lens + b * bs
        end = torch.clamp(start + bs, max=lens + G)
        in_block = (cols >= start[:, None]) & (cols < end[:, None])
        counts = _schedule((in_block & (x == mask)).sum(-1), steps, device)
        for i in range(counts.shape[1]):
            x0, p = _propose(model(x, pos, None, 0, key_mask), params, gen)
            cand = (x == mask) & (cols < (lens + (b + 1) * bs)[:, None])
            commit = topk_rows(p, cand, counts[:, i])
            x = torch.where(commit, x0, x)
            commits.append(commit.sum(-1))
            trace.append(ForwardRecord("full", B, T, 0, block=b))
    return _decoded(x, lens.tolist(), G, trace, commits, "none", max(map(len, prompts)))


def _infill(model: DiffusionLM, tokens: TokenIds, prompts: list[list[int]], suffixes: list[list[int]],
            params: GenerationParams) -> Decoded:
    """`MDLMSampler.infill` on the canvases prompt + gen_length masks + suffix: rows right-padded
    with end-of-text to the longest (masked out of attention), blocks of `block_length` over the
    whole canvas from position 0 (a block without masks costs no forward), ceil(steps / blocks)
    steps per block, candidates the masks inside the block and the row."""
    device = next(model.parameters()).device
    mask, G, bs = tokens.mask, params.gen_length, params.block_length
    rows = [p + [mask] * G + s for p, s in zip(prompts, suffixes)]
    lens = torch.tensor([len(r) for r in rows], device=device)
    B, T = len(rows), max(map(len, rows))
    x = torch.full((B, T), tokens.eos, dtype=torch.long, device=device)
    for r, row in enumerate(rows):  # host-side setup, once per batch
        x[r, : len(row)] = torch.tensor(row, dtype=torch.long, device=device)
    cols = torch.arange(T, device=device)[None, :]
    key_mask = cols < lens[:, None]
    pos = cols.expand(B, -1)
    num_blocks = math.ceil(T / bs)
    steps = math.ceil(params.total_steps / num_blocks)
    gen = _generator(params, device)
    trace, commits = [], []
    for b in range(num_blocks):
        in_block = (cols >= b * bs) & (cols < torch.clamp(lens, max=min(b * bs + bs, T))[:, None])
        counts = _schedule((in_block & (x == mask)).sum(-1), steps, device)
        for i in range(counts.shape[1]):
            x0, p = _propose(model(x, pos, None, 0, key_mask), params, gen)
            commit = topk_rows(p, (x == mask) & in_block, counts[:, i])
            x = torch.where(commit, x0, x)
            commits.append(commit.sum(-1))
            trace.append(ForwardRecord("full", B, T, 0, block=b))
    return _decoded(x, [len(p) for p in prompts], G, trace, commits, "none", max(map(len, prompts)))


def _bd3lm_mask(valid: torch.Tensor, size: int, width: int, eager: bool) -> torch.Tensor:
    """The (B, 1, T, width) attention mask the BD3LM sampler builds for its (B, T) canvas (`valid`:
    not the pad id), as the model applies it: a boolean (sdpa) or the boolean added to the
    scores (eager: 1.0 allowed, 0.0 not); key columns past T are not there at all."""
    T = valid.shape[1]
    blk = torch.arange(T, device=valid.device) // size
    allowed = (blk[None, :, None] >= blk[None, None, :]) & valid[:, :, None] & valid[:, None, :]
    allowed = torch.nn.functional.pad(allowed, (0, width - T))[:, None]
    if not eager:
        return allowed
    exists = torch.arange(width, device=valid.device) < T
    return torch.where(exists, allowed.float(), -torch.inf)


def _logical_positions(valid: torch.Tensor) -> torch.Tensor:
    return torch.where(valid, valid.long().cumsum(-1) - 1, 0)


@torch.inference_mode()
def decode_bd3lm(model: DiffusionLM, tokens: TokenIds, prompts: list[list[int]], params: GenerationParams) -> Decoded:
    _check(params, model, "dllm-bd3lm")
    if model.config.block_size:
        raise UnmaskError("compat 'dllm-bd3lm' builds its own block attention; this model's config already sets "
                          f"blocks of {model.config.block_size}", param="compat")
    device = next(model.parameters()).device
    mask, eos, G, bs = tokens.mask, tokens.eos, params.gen_length, params.block_length
    pad = tokens.pad if tokens.pad is not None else tokens.eos
    eager = params.attn_implementation == "eager"
    B, longest = len(prompts), max(map(len, prompts))
    P = math.ceil(longest / bs) * bs
    width = P + G
    x = torch.full((B, width), pad, dtype=torch.long, device=device)
    for r, p in enumerate(prompts):  # host-side setup, once per batch
        x[r, P - len(p) : P] = torch.tensor(p, dtype=torch.long, device=device)
    kv = StaticKV(model.config.num_layers, width)
    num_blocks = math.ceil(G / bs)
    steps = math.ceil(params.total_steps / num_blocks)
    gen = _generator(params, device)
    trace, commits = [], []
    done = torch.zeros(B, dtype=torch.bool, device=device)
    end = P
    for b in range(num_blocks):
        if bool(done.all()):
            break
        cur = min(bs, G - b * bs)
        start, end = end, end + cur
        valid = x[:, :start] != pad
        model(x[:, :start], _logical_positions(valid), kv, 0, None, slice(start - 1, start),
              attn_mask=_bd3lm_mask(valid, bs, width, eager))
        commits.append(torch.zeros(B, dtype=torch.long, device=device))
        trace.append(ForwardRecord("full", B, start, 0, block=b))
        x[:, start:end] = mask
        valid = x[:, :end] != pad
        attn = _bd3lm_mask(valid, bs, width, eager)[:, :, start:end]
        pos = _logical_positions(valid)[:, start:end]
        counts = _schedule(torch.full((B,), cur, device=device), steps, device)
        for i in range(counts.shape[1]):
            open_ = x[:, start:end] == mask
            if not bool(open_.any()):
                break
            x0, p = _propose(model(x[:, start:end], pos, kv, start, None, None, attn_mask=attn), params, gen)
            commit = topk_rows(p, open_, torch.minimum(counts[:, i], open_.sum(-1)))
            x[:, start:end] = torch.where(commit, x0, x[:, start:end])
            commits.append(commit.sum(-1))
            trace.append(ForwardRecord("window", B, cur, 0, block=b))
        done |= (x[:, start:end] == eos).any(-1)
    return _decoded(x[:, :end], [P] * B, end - P, trace, commits, "exact", P)


def _decoded(x: torch.Tensor, starts: list[int], G: int, trace: list, commits: list, cache: str,
             prompt_len: int) -> Decoded:
    """Each row's generated region, and the forwards (every row takes part in every one)."""
    per_row = torch.stack(commits, 1).tolist() if commits else [[] for _ in starts]
    for rec, n in zip(trace, torch.stack(commits).sum(-1).tolist() if commits else []):
        rec.committed = n
    rows = [row[s : s + G] for row, s in zip(x.tolist(), starts)]
    return Decoded(rows, [len(trace)] * len(starts), per_row, trace, cache, prompt_len)
