"""Proposal: for every scored position, a candidate token and a confidence.

Two sampling families exist upstream and both are reproduced:
- "gumbel" (LLaDA, Fast-dLLM): x0 = argmax(exp(logits) / (-log U)^T) with U ~ U(0,1) drawn in float64
  over the whole logits tensor; the confidence is the *untempered, unfiltered* probability of x0
  (top-k / top-p only restrict which tokens can be chosen).
- "categorical" (Dream): logits / T, then top-k / top-p filters, then a categorical sample; the
  confidence is the probability of the sample under that tempered, filtered distribution.
The MASK token is never proposed (the reference samplers can propose it and then never finish).
"""

from dataclasses import dataclass

import torch

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


def propose(logits: torch.Tensor, cfg: ProposalConfig, generator: torch.Generator | None = None) -> Proposal:
    """logits (B, W, V) -> Proposal over the same W positions."""
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
