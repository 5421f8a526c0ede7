"""Proposal: for every scored position, a candidate token and a confidence.

Two sampling families exist upstream and both are reproduced:
- "gumbel" (LLaDA, Fast-dLLM): x0 = argmax(exp(logits) / (-log U)^T) with U ~ U(0,1) drawn in float64
  over the whole logits tensor; the confidence is the *untempered, unfiltered* probability of x0
  (top-k / top-p only restrict which tokens can be chosen).
- "categorical" (Dream): logits / T, then top-k / top-p filters, then a categorical sample; the
  confidence is the probability of the sample under that tempered, filtered distribution.
The MASK token is never proposed (the reference samplers can propose it and then never finish).

Under tensor parallelism each rank holds the logits of its vocabulary slice. The proposals that
only need reductions over the vocabulary (greedy or Gumbel sampling, with the probability,
margin, entropy or random confidence) are computed from per-slice (max, sum, argmax, top-2)
statistics: each rank sends a few numbers per position, never its logits (as SGLang's TP-local
vocabulary state does). Sampling draws the Gumbel noise over the whole vocabulary from the
request's generator and each rank uses its slice, so a seed gives the same tokens at any rank
count. Top-k / top-p filters, Dream's categorical sampling and the bit-exact reference softmax
gather the whole logits first.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from unmask.knobs import NON_NEGATIVE, UNIT, Knob, choices, positive_int

CONFIDENCES = ("prob", "margin", "neg_entropy", "random")


@dataclass(frozen=True)
class ProposalConfig:
    mask_id: int
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    confidence: str = "prob"  # one of CONFIDENCES
    sampling: str = "gumbel"  # "gumbel" | "categorical"
    # float64 reproduces Fast-dLLM's confidence bit for bit; float32 is enough otherwise
    precision: torch.dtype = torch.float32
    random_dtype: torch.dtype = torch.float32
    # gather from a full softmax (bit-exact with the references) instead of exp(l - logsumexp(l))
    exact_softmax: bool = False
    need_entropy: bool = False

    # the generation parameters the proposal reads ("random" confidence is what remasking=random uses)
    fields: ClassVar[dict[str, Knob]] = {
        "confidence": Knob("prob", str, "score that policies rank candidates by",
                           choices(tuple(c for c in CONFIDENCES if c != "random")), from_model=True),
        "temperature": Knob(0.0, float, "sampling temperature (0: greedy)", NON_NEGATIVE),
        "top_k": Knob(None, int, "sample among the k most likely tokens", positive_int),
        "top_p": Knob(None, float, "sample from the smallest set with probability >= p", UNIT),
    }


@dataclass
class Proposal:
    tokens: torch.Tensor  # (B, W) int64
    score: torch.Tensor  # (B, W) ranking confidence, higher = more certain
    entropy: torch.Tensor | None  # (B, W) entropy of the predictive distribution, if asked for


def _filter_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    k = min(k, logits.shape[-1])
    kth = torch.topk(logits, k).values[..., -1:]
    return logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)


def _filter_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    sorted_logits, order = torch.sort(logits, descending=True)
    cum = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
    drop = cum > p
    drop[..., 1:] = drop[..., :-1].clone()
    drop[..., 0] = False
    mask = torch.zeros_like(drop).scatter_(-1, order, drop)
    return logits.masked_fill(mask, torch.finfo(logits.dtype).min)


def _entropy(probs: torch.Tensor) -> torch.Tensor:
    # Dream's formula (epsilon inside the log); negative of it is Dream's "entropy" confidence
    return -(probs * torch.log(probs + 1e-10)).sum(-1)


def propose(logits: torch.Tensor, cfg: ProposalConfig, generator: torch.Generator | None = None,
            tp=None, vocab: int = 0) -> Proposal:
    """logits (B, W, V) -> Proposal over the same W positions. With `tp` (a TensorParallel group),
    logits (B, W, V_rank) are this rank's slice of a `vocab`-sized vocabulary."""
    if tp is not None:
        if not local_proposal(cfg):
            logits = tp.gather_vocab(logits, vocab)
        else:
            return _propose_local(logits, cfg, generator, tp, vocab)
    if cfg.sampling == "categorical":
        return _propose_categorical(logits, cfg, generator)
    return _propose_gumbel(logits, cfg, generator)


def _propose_gumbel(logits: torch.Tensor, cfg: ProposalConfig, generator: torch.Generator | None) -> Proposal:
    logits = logits.to(cfg.precision)
    # top-k / top-p restrict the choice; the confidence stays the model's own probability
    allowed = logits
    if cfg.top_k is not None:
        allowed = _filter_top_k(allowed, cfg.top_k)
    if cfg.top_p is not None and cfg.top_p < 1:
        allowed = _filter_top_p(allowed, cfg.top_p)
    if cfg.temperature > 0:
        u = torch.rand(logits.shape, dtype=torch.float64, generator=generator, device=logits.device)
        choice = allowed.to(torch.float64).exp() / (-torch.log(u)) ** cfg.temperature
    else:
        choice = allowed.clone()
    choice[..., cfg.mask_id] = -torch.inf
    tokens = choice.argmax(-1)
    need_probs = cfg.confidence in ("margin", "neg_entropy") or cfg.need_entropy
    probs = torch.softmax(logits, dim=-1) if (need_probs or cfg.exact_softmax) else None
    if cfg.confidence == "random":
        score = torch.rand(tokens.shape, dtype=cfg.random_dtype, generator=generator, device=logits.device)
    elif cfg.confidence == "prob":
        if probs is not None:
            score = probs.gather(-1, tokens[..., None]).squeeze(-1)
        else:  # exp(l - logsumexp(l)) at the chosen token: no (B, W, V) probability tensor
            score = (logits.gather(-1, tokens[..., None]).squeeze(-1) - torch.logsumexp(logits, -1)).exp()
    else:
        score = _score_from_probs(probs, cfg.confidence)
    entropy = _entropy(probs) if cfg.need_entropy else None
    return Proposal(tokens, score, entropy)


def _score_from_probs(probs: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "margin":
        top2 = torch.topk(probs, 2, dim=-1).values
        return top2[..., 0] - top2[..., 1]
    return -_entropy(probs)  # "neg_entropy"


def _propose_categorical(logits: torch.Tensor, cfg: ProposalConfig, generator: torch.Generator | None) -> Proposal:
    logits = logits.to(cfg.precision)
    if cfg.temperature > 0:
        logits = logits / cfg.temperature
    if cfg.top_p is not None and cfg.top_p < 1:
        logits = _filter_top_p(logits, cfg.top_p)
    if cfg.top_k is not None:
        logits = _filter_top_k(logits, cfg.top_k)
    probs = torch.softmax(logits, dim=-1)
    pick = probs.clone()
    pick[..., cfg.mask_id] = 0.0
    if cfg.temperature > 0:
        flat = pick.reshape(-1, pick.shape[-1])
        flat = flat / flat.sum(-1, keepdim=True)
        tokens = torch.multinomial(flat, 1, True, generator=generator).view(pick.shape[:-1])
        conf = probs.gather(-1, tokens[..., None]).squeeze(-1)
    else:
        conf, tokens = pick.max(-1)
    if cfg.confidence in ("margin", "neg_entropy"):
        conf = _score_from_probs(probs, cfg.confidence)
    elif cfg.confidence == "random":
        conf = torch.rand(tokens.shape, dtype=cfg.random_dtype, generator=generator, device=logits.device)
    entropy = _entropy(probs) if cfg.need_entropy else None
    return Proposal(tokens, conf, entropy)


def local_proposal(cfg: ProposalConfig) -> bool:
    """Whether proposals under `cfg` reduce over vocabulary slices (else the logits are gathered)."""
    greedy_categorical = cfg.sampling == "categorical" and cfg.temperature == 0
    return ((cfg.sampling == "gumbel" or greedy_categorical) and cfg.top_k is None
            and (cfg.top_p is None or cfg.top_p >= 1) and not cfg.exact_softmax)


def _propose_local(logits: torch.Tensor, cfg: ProposalConfig, generator, tp, vocab: int) -> Proposal:
    """The Gumbel / greedy proposal from this rank's vocabulary slice (see the module notes)."""
    lo, hi = tp.vocab_range(vocab)
    logits = logits.to(cfg.precision)
    if cfg.temperature > 0:  # the whole vocabulary's noise, from the same generator as one rank would draw
        u = torch.rand((*logits.shape[:-1], vocab), dtype=torch.float64, generator=generator, device=logits.device)
        choice = logits.to(torch.float64).exp() / (-torch.log(u[..., lo:hi])) ** cfg.temperature
    else:
        choice = logits.clone()
    if lo <= cfg.mask_id < hi:
        choice[..., cfg.mask_id - lo] = -torch.inf
    best, arg = choice.max(-1)
    m = logits.max(-1).values
    s = (logits - m[..., None]).exp().sum(-1)
    stats = [best.to(torch.float64), (arg + lo).to(torch.float64), logits.gather(-1, arg[..., None]).squeeze(-1),
             m, s]
    margin = cfg.confidence == "margin"
    if margin:
        top2 = torch.topk(logits, min(2, logits.shape[-1]), dim=-1).values
        if top2.shape[-1] < 2:
            top2 = torch.cat([top2, torch.full_like(top2, -torch.inf)], -1)
        stats += [top2[..., 0], top2[..., 1]]
    g = tp.all_gather(torch.stack([t.to(torch.float64) for t in stats], -1))  # (world, B, W, n)
    rank = g[..., 0].argmax(0, keepdim=True)  # the first rank with the largest choice: whole-vocabulary argmax
    won = g.gather(0, rank[..., None].expand(1, *g.shape[1:])).squeeze(0)
    tokens = won[..., 1].long()
    M = g[..., 3].max(0).values
    lse = (M + (g[..., 4] * (g[..., 3] - M).exp()).sum(0).log()).to(cfg.precision)
    entropy = None
    if cfg.need_entropy or cfg.confidence == "neg_entropy":
        p = (logits - lse[..., None]).exp()
        entropy = tp.all_reduce(-(p * torch.log(p + 1e-10)).sum(-1))
    if cfg.confidence == "random":
        score = torch.rand(tokens.shape, dtype=cfg.random_dtype, generator=generator, device=logits.device)
    elif cfg.confidence == "prob":
        score = (won[..., 2].to(cfg.precision) - lse).exp()
    elif margin:
        top = g[..., 5:7].permute(1, 2, 0, 3).reshape(*g.shape[1:3], -1)
        top2 = torch.topk(top, 2, dim=-1).values.to(cfg.precision)
        score = (top2[..., 0] - lse).exp() - (top2[..., 1] - lse).exp()
    else:
        score = -entropy
    return Proposal(tokens, score, entropy if cfg.need_entropy else None)


def token_prob(logits: torch.Tensor, tokens: torch.Tensor, tp=None, vocab: int = 0) -> torch.Tensor:
    """The model's probability of `tokens` (B, W) from logits (B, W, V) (or, with `tp`, this
    rank's vocabulary slice), without a (B, W, V) probability tensor."""
    lg = logits.float()
    if tp is None:
        return (lg.gather(-1, tokens[..., None]).squeeze(-1) - lg.logsumexp(-1)).exp()
    lo, hi = tp.vocab_range(vocab)
    here = (tokens >= lo) & (tokens < hi)
    picked = lg.gather(-1, (tokens - lo).clamp(0, hi - lo - 1)[..., None]).squeeze(-1)
    m = lg.max(-1).values
    stats = torch.stack([torch.where(here, picked, 0.0), m, (lg - m[..., None]).exp().sum(-1)], -1)
    g = tp.all_gather(stats)
    M = g[..., 1].max(0).values
    lse = M + (g[..., 2] * (g[..., 1] - M).exp()).sum(0).log()
    return (g[..., 0].sum(0) - lse).exp()
