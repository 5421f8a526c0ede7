"""The BD3-LM repository's sampler (kuleshov-group/bd3lms `diffusion.py`: `Diffusion._semi_ar_sampler`
with `_ddpm_caching_update`, `_nucleus_sample` and `_sample_categorical`; the `_sample` retry loop and
`_check_stop_conds`), reproduced token for token and forward for forward (`compat bd3lms`), on
MDLM and BD3-LM models (unmask.models.dit). Checked against what that code returned
(tests/test_bd3lms_upstream.py).

The reference samples unconditionally: each sequence starts with BOS (GPT-2's end-of-text), then
masks. Here a prompt follows the BOS (committed before sampling, as the reference's BOS is; a
prompt that starts with BOS gets no second one): the prompt "<|endoftext|>" (BOS alone) is the
reference exactly. The canvas is BOS + prompt + gen_length tokens,
in strides of the model's block (BD3-LM: its block_size; MDLM: the whole canvas, one stride).

Per stride, the canvas so far (at most the last 1024 tokens: the reference's context) is
forwarded in full each step, the new block's logits taken, and (`steps` per stride, the
reference's T; the stride stops early once no mask is left):
- first hitting (its default): one masked position of the block, drawn uniformly
  (`torch.randint`), gets a token drawn from the model's distribution (Gumbel: u uniform float64
  over the whole (B, block, V) tensor, argmax of p / (1e-10 - log(u + 1e-10))); one sequence at a
  time (the reference reads the mask count with `.item()`);
- otherwise the DDPM update at t = linspace(1, 0, steps)[i], dt = 1 / steps: each mask stays
  masked with probability (t - dt) / t (float32), else takes a token drawn from p (the same Gumbel
  draw over p * (1 - that), the mask's column set to it); a step that changes nothing keeps its
  probabilities and the next step runs no forward.
`top_p` is the reference's nucleus_p (the kept tokens' probabilities renormalised). After each
stride past 256 tokens, a batch whose last 256 tokens have entropy under 4 nats is sampled again
from the start (the random stream continues), at most 11 times, as the reference's `_sample` does.
Its KV-cache path (`sampling.kv_cache`) runs on CUDA only and stores K/V in bfloat16: not this mode.
"""

import torch

from unmask.errors import UnmaskError
from unmask.models.base import DiffusionLM, TokenIds
from unmask.params import GenerationParams
from unmask.trace import Decoded, ForwardRecord

CONTEXT = 1024  # the reference's context_size: the forward window's longest
STOP_TAIL, STOP_ENTROPY, TRIES = 256, 4.0, 11


def _sample_categorical(p: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    u = torch.rand(p.shape, dtype=p.dtype, generator=gen, device=p.device)
    return (p / (1e-10 - (u + 1e-10).log())).argmax(dim=-1)


def _nucleus(p: torch.Tensor, top_p: float | None) -> torch.Tensor:
    if top_p is None or top_p == 1.0:
        return p
    probs, idx = p.sort(dim=-1, descending=True)
    keep = probs.cumsum(dim=-1) <= top_p
    keep[..., 0] = 1
    out = p.clone().scatter_(-1, idx, probs * keep)
    return out / out.sum(-1, keepdim=True)


def _log_probs(model: DiffusionLM, x: torch.Tensor) -> torch.Tensor:
    """The reference's `forward` (subs parameterization) over the window x: log-probabilities of
    each position's token, the mask excluded (the model returns its logit as -inf)."""
    pos = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
    logits = model(x, pos)
    return logits - torch.logsumexp(logits, dim=-1, keepdim=True)


def _heads(tokens: TokenIds, prompts: list[list[int]]) -> list[list[int]]:
    """Each sequence's committed start: BOS, then the prompt (which may begin with it)."""
    bos = tokens.bos if tokens.bos is not None else tokens.eos
    return [p if p[:1] == [bos] else [bos] + p for p in prompts]


def _check(model: DiffusionLM, heads: list[list[int]], params: GenerationParams) -> int:
    """The stride (block) of the model, with the canvas checked against it."""
    c = model.config
    if c.family not in ("mdlm", "bd3lm"):
        raise UnmaskError(f"compat 'bd3lms' runs MDLM and BD3-LM models; this is a {c.family} model", param="compat")
    if len({len(h) for h in heads}) > 1:
        raise UnmaskError("compat 'bd3lms' needs prompts of equal length (BOS included): the reference's rows are "
                          "one canvas", param="prompt")
    total = len(heads[0]) + params.gen_length
    block = c.block_size if c.block_size else total
    if total > c.max_positions:
        raise UnmaskError(f"BOS + prompt + gen_length = {total} tokens exceed the model's {c.max_positions} "
                          "(model_length)", param="gen_length")
    if total % block:
        want = -(-total // block) * block - len(heads[0])
        raise UnmaskError(f"BOS + prompt + gen_length = {total} tokens: the reference samples whole blocks of "
                          f"{block}; use gen_length {want}", param="gen_length")
    if params.first_hitting and len(heads) > 1:
        raise UnmaskError("first_hitting samples one sequence at a time in the reference (its mask count is read "
                          f"with .item()); this batch has {len(heads)} (set first_hitting false to batch)",
                          param="first_hitting")
    return block


@torch.inference_mode()
def decode_bd3lms(model: DiffusionLM, tokens: TokenIds, prompts: list[list[int]], params: GenerationParams) -> Decoded:
    heads = _heads(tokens, prompts)
    block = _check(model, heads, params)
    device = next(model.parameters()).device
    gen = torch.Generator(device).manual_seed(params.seed) if params.seed is not None else None
    trace: list[ForwardRecord] = []
    commits: list[torch.Tensor] = []
    for _ in range(TRIES):
        x = _sample(model, tokens.mask, heads, params, block, gen, trace, commits, device)
        if x is not None:
            start = len(heads[0])
            per_row = torch.stack(commits, 1).tolist()
            for rec, n in zip(trace, torch.stack(commits).sum(-1).tolist()):
                rec.committed = n
            rows = [row[start:] for row in x.tolist()]
            return Decoded(rows, [len(trace)] * len(prompts), per_row, trace, "none", start)
    raise UnmaskError(f"the reference's sampling failed: {TRIES} samples in a row ended with the entropy of their last "
                      f"{STOP_TAIL} tokens under {STOP_ENTROPY:g} (its _check_stop_conds); try another seed")


def _sample(model, mask, heads, params, block, gen, trace, commits, device):
    """One `_semi_ar_sampler` call: the canvas, or None when it stopped for low entropy."""
    B = len(heads)
    head = torch.tensor(heads, dtype=torch.long, device=device)
    total = head.shape[1] + params.gen_length
    steps = params.steps if params.steps is not None else 5000
    x = torch.full((B, total), mask, dtype=torch.long, device=device)
    x[:, : head.shape[1]] = head
    ones = torch.ones((B, 1), dtype=torch.float32, device=device)
    timesteps = torch.linspace(1, 0, steps, device=device)
    dt = 1 / steps
    for stride in range(total // block):
        end = (stride + 1) * block
        start = max(end - CONTEXT, 0)
        p_x0 = None
        for i in range(steps):
            if not bool((x[:, :end] == mask).any()):
                break
            window = x[:, start:end]
            if p_x0 is None:
                p_x0 = _log_probs(model, window).to(torch.float64)[:, -block:].exp()
                p_x0 = _nucleus(p_x0, params.top_p)
                trace.append(ForwardRecord("full", B, end - start, 0, block=stride))
                commits.append(torch.zeros(B, dtype=torch.long, device=device))
            cur = window[:, -block:]
            if params.first_hitting:
                proposal = _sample_categorical(p_x0, gen)
                open_ = cur == mask
                ind = torch.randint(0, int(open_.sum()), (B,), generator=gen, device=device)
                ind = open_.nonzero()[ind, 1]
                hit = (torch.arange(block, device=device) == ind[:, None]).to(proposal.dtype)
                proposal = proposal * hit + cur * (1 - hit)
            else:
                t = timesteps[i] * ones
                mask_prob = ((t - dt) / t)[:, None]
                q = p_x0 * (1 - mask_prob)
                q[:, :, mask] = mask_prob.squeeze(-1)
                proposal = _sample_categorical(q, gen)
            keep = (cur != mask).to(x.dtype)
            new = keep * cur + (1 - keep) * proposal
            changed = not torch.equal(new, cur)
            commits[-1] = commits[-1] + ((cur == mask) & (new != mask)).sum(-1)
            x[:, end - block : end] = new
            if changed:
                p_x0 = None
        if end > STOP_TAIL and _entropy(x[:, :end][:, -STOP_TAIL:]) < STOP_ENTROPY:
            return None
    return x


def _entropy(x: torch.Tensor) -> float:
    _, counts = torch.unique(x, return_counts=True, sorted=False)
    return float(torch.special.entr(counts.float() / counts.sum()).sum())
