"""Open-dCoder's `diffusion_generate` (pengzhangzhi/Open-dLLM,
veomni/models/transformers/qwen2/generation_utils.py, `MDMGenerationMixin._mdm_sample`),
reproduced token for token and forward for forward (`compat open-dcoder`), on its Qwen2 model run
as it runs it, greedy or sampled (temperature, top_p, top_k, alg_temp; the seed stands
for the `torch.manual_seed` before the call). Checked against what its own code returned
(tests/test_open_dcoder_upstream.py).

The canvas is each prompt, gen_length masks and (infilling, as its eval does it) the suffix; the
rows have one length (the sampler takes one tensor). Dream's timesteps, linspace(1, eps, steps + 1);
step i runs one forward over the whole canvas, its logits shifted right by one (hidden state j
scores token j + 1; the first keeps its own), and stops early once no mask is left. Algorithms:
- origin: each mask is committed with probability 1 - s/t (all on the last step), one uniform per
  mask in row-major order, the argmax token;
- maskgit_plus / topk_margin / entropy: per row, floor(masks * (1 - s/t)) masks (all on the last
  step) with the highest confidence (the argmax's probability, the top-two margin, or the
  negative entropy with probabilities clamped at 1e-10), one torch.topk over the batch (with
  `alg_temp`, over the confidences divided by it plus Gumbel noise);
- p2: every generated position gets the argmax at every step, then the floor(n * (1 - (i+1)/steps))
  least confident of the n generated positions are masked again (one torch.argsort over the
  canvas, the prompt and suffix at +inf).
Attention is bidirectional (the sampler's `is_causal=False` under transformers' sdpa attention).
One quirk is kept: when config.json sets pad_token_id and the initial canvas of any row holds
that id, transformers turns the sampler's padding mask into a *causal* mask with those keys
masked (additive, the float32 minimum), for every row and every step.
"""

import torch

from unmask.errors import UnmaskError
from unmask.models.base import DiffusionLM, TokenIds
from unmask.models.blockdiff import Qwen2Release
from unmask.params import GenerationParams
from unmask.trace import Decoded, ForwardRecord


def _sample(logits: torch.Tensor, alg: str, p: GenerationParams | None = None,
            gen: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampler's `sample_tokens`: (confidence, token). With a temperature the logits are divided
    by it, filtered to top_p then top_k (the rest at the float32 minimum), and the token drawn as
    torch.distributions.Categorical draws it (one multinomial over the normalised rows); the
    confidence is read from those tempered, filtered probabilities."""
    if p is not None and p.temperature > 0:
        logits = logits / p.temperature
    if p is not None and p.top_p is not None and p.top_p < 1:
        logits = _top_p(logits, p.top_p)
    if p is not None and p.top_k is not None:
        logits = _top_k(logits, p.top_k)
    probs = torch.softmax(logits.float(), dim=-1)
    if p is not None and p.temperature > 0:
        flat = (probs / probs.sum(-1, keepdim=True)).reshape(-1, probs.shape[-1])
        x0 = torch.multinomial(flat, 1, True, generator=gen).T.reshape(probs.shape[:-1])
        confidence = probs.gather(-1, x0[..., None]).squeeze(-1)
    else:
        confidence, x0 = probs.max(dim=-1)
    if alg == "topk_margin":
        top = torch.sort(probs, dim=-1, descending=True).values
        confidence = top[..., 0] - top[..., 1]
    elif alg == "entropy":
        confidence = (probs * torch.log(probs.clamp(min=1e-10))).sum(dim=-1)
    return confidence, x0


def _top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    ordered, order = torch.sort(logits, descending=True)
    drop = torch.cumsum(torch.softmax(ordered, dim=-1), dim=-1) > top_p
    drop[..., 1:] = drop[..., :-1].clone()
    drop[..., 0] = 0
    drop = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, order, drop)
    return logits.masked_fill(drop, torch.finfo(logits.dtype).min)


def _top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    if top_k == 0:
        return logits
    top_k = min(top_k, logits.size(-1))
    return logits.masked_fill(logits < torch.topk(logits, top_k)[0][..., -1, None], torch.finfo(logits.dtype).min)


def _attention(model: DiffusionLM, x: torch.Tensor) -> torch.Tensor | None:
    """None (bidirectional), or the causal padding mask transformers builds when config.json's pad
    id appears in the initial canvas."""
    release = model.config.layout
    pad = release.config_pad_id if isinstance(release, Qwen2Release) else None
    if pad is None or not bool((x == pad).any()):
        return None
    L = x.shape[1]
    allowed = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()[None, None] & (x != pad)[:, None, None, :]
    return torch.zeros(allowed.shape, device=x.device).masked_fill(~allowed, torch.finfo(torch.float32).min)


@torch.inference_mode()
def decode_open_dcoder(model: DiffusionLM, tokens: TokenIds, prompts: list[list[int]], params: GenerationParams,
                       suffixes: list[list[int]] | None = None) -> Decoded:
    if model.config.logit_shift != 1 or model.config.causal:
        raise UnmaskError("compat 'open-dcoder' runs Open-dCoder (a bidirectional Qwen2 with token shift)",
                          param="compat")
    tails = suffixes or [[] for _ in prompts]
    if len({len(p) + len(s) for p, s in zip(prompts, tails)}) > 1:
        raise UnmaskError("compat 'open-dcoder' needs rows of one length (the sampler takes one tensor): equal "
                          "prompt lengths and, infilling, equal suffix lengths")
    device = next(model.parameters()).device
    mask, G, steps, alg = tokens.mask, params.gen_length, params.total_steps, params.alg
    x = torch.tensor([p + [mask] * G + s for p, s in zip(prompts, tails)], dtype=torch.long, device=device)
    B, L = x.shape
    fix = x != mask
    attn = _attention(model, x)
    pos = torch.arange(L, device=device)[None].expand(B, -1)
    timesteps = torch.linspace(1, params.eps, steps + 1, device=device)
    gen = torch.Generator(device).manual_seed(params.seed) if params.seed is not None else None
    rows = torch.arange(B, device=device)
    trace, commits = [], []
    for i in range(steps):
        mask_index = x == mask
        if not bool(mask_index.any()):
            break
        logits = model(x, pos, None, 0, None, None, attn_mask=attn)
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        t, s = timesteps[i], timesteps[i + 1]
        before = x.clone()
        if alg == "origin":
            p_transfer = 1 - s / t if i < steps - 1 else 1
            picked = torch.full((int(mask_index.sum()),), mask, dtype=torch.long, device=device)
            transfer = torch.rand(picked.shape, generator=gen, device=device) < p_transfer
            picked[transfer] = _sample(logits[mask_index][transfer], alg, params, gen)[1]
            x[mask_index] = picked
        elif alg == "p2":
            conf, x0 = _sample(logits, alg, params, gen)
            conf[fix] = float("inf")
            conf = torch.where(torch.isfinite(conf), conf, torch.full_like(conf, float("inf")))
            n = (~fix).sum(dim=1)
            again = torch.minimum((n.float() * (1.0 - (i + 1) / steps)).floor().to(torch.long).clamp_min(0), n)
            order = torch.argsort(conf, dim=1, descending=False)
            k = int(again.max())
            to_mask = torch.zeros_like(x, dtype=torch.bool)
            if k > 0:
                keep = torch.arange(k, device=device)[None] < again[:, None]
                to_mask[rows[:, None].expand(-1, k)[keep], order[:, :k][keep]] = True
            x[to_mask] = mask
            fill = mask_index & ~to_mask
            x[fill] = x0[fill]
        else:  # maskgit_plus, topk_margin, entropy
            conf, x0 = _sample(logits[mask_index], alg, params, gen)
            count = mask_index.sum(dim=1)
            if i < steps - 1:
                count = (count.float() * (1 - s / t)).long()
            full = torch.full(x.shape, -torch.inf, dtype=logits.dtype, device=device)
            full[mask_index] = conf.to(logits.dtype)
            k = int(count.max())
            if k > 0:
                if params.alg_temp:  # Gumbel top-k over the positions
                    u = torch.rand(full.shape, generator=gen, device=device).clamp_(min=1e-20, max=1 - 1e-20)
                    full = full / params.alg_temp - torch.log(-torch.log(u))
                idx = torch.topk(full, k, dim=1).indices
                keep = torch.arange(k, device=device)[None] < count[:, None]
                proposed = torch.full_like(x, mask)
                proposed[mask_index] = x0
                r, c = rows[:, None].expand(-1, k)[keep], idx[keep]
                x[r, c] = proposed[r, c]
        committed = (before == mask) & (x != mask)
        commits.append(committed.sum(-1))
        trace.append(ForwardRecord("full", B, L, int(committed.sum()), block=0,
                                   remasked=int(((before != mask) & (x == mask)).sum())))
    P = len(prompts[0])
    per_row = torch.stack(commits, 1).tolist() if commits else [[] for _ in range(B)]
    return Decoded([row[P : P + G] for row in x.tolist()], [len(trace)] * B, per_row, trace, "none", P)
