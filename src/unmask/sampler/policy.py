"""Commit policies: which masked candidates receive their final token this step.

All policies are batched over rows: inputs are (B, W) tensors whose non-candidate entries are
ignored; output is a (B, W) bool tensor that is a subset of the candidates. Every policy commits
at least one token in a row that has a candidate and a positive quota.
"""

from dataclasses import dataclass
from typing import Protocol

import torch

from unmask.sampler.schedule import DreamSchedule


class CommitPolicy(Protocol):
    uses_schedule: bool  # does it consume the schedule's per-step quota?
    needs_entropy: bool

    def select(
        self,
        score: torch.Tensor,
        entropy: torch.Tensor | None,
        candidates: torch.Tensor,
        quota: torch.Tensor | None,
        step: int,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        ...


def take_top(score: torch.Tensor, candidates: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The k[b] highest-scoring candidates of each row b (descending sort, first k)."""
    s = score.masked_fill(~candidates, -torch.inf)
    order = torch.sort(s, dim=-1, descending=True).indices
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(s.shape[-1], device=s.device).expand_as(order))
    return (rank < k[:, None]) & candidates


def _sorted_candidates(score: torch.Tensor, candidates: torch.Tensor, descending: bool = True):
    fill = -torch.inf if descending else torch.inf
    s = score.masked_fill(~candidates, fill)
    sorted_s = torch.sort(s, dim=-1, descending=descending).values
    n = candidates.sum(-1)
    valid = torch.arange(s.shape[-1], device=s.device)[None, :] < n[:, None]
    return sorted_s, valid, n


@dataclass
class FixedPolicy:
    """LLaDA: commit the schedule's quota, most confident first (or in random order when the
    score is a random draw)."""

    uses_schedule: bool = True
    needs_entropy: bool = False

    def select(self, score, entropy, candidates, quota, step, generator):
        return take_top(score, candidates, quota)


@dataclass
class ThresholdPolicy:
    """Fast-dLLM: every candidate with confidence >= threshold, plus the most confident one."""

    threshold: float
    uses_schedule: bool = False
    needs_entropy: bool = False

    def select(self, score, entropy, candidates, quota, step, generator):
        commit = candidates & (score >= self.threshold)
        s = score.masked_fill(~candidates, -torch.inf)
        best = torch.zeros_like(commit).scatter_(-1, s.argmax(-1, keepdim=True), True)
        return commit | (best & candidates)


@dataclass
class FactorPolicy:
    """Fast-dLLM's factor rule: the n-th most confident candidate passes if c >= 1 - f/(n+1).
    The first failing rank j bounds the commit count, with upstream's edge cases: j = 0 or
    j = N-1 (including "nothing failed") commit one more, so N <= 2 commits everything."""

    factor: float
    uses_schedule: bool = False
    needs_entropy: bool = False

    def select(self, score, entropy, candidates, quota, step, generator):
        sorted_s, valid, n = _sorted_candidates(score, candidates)
        j = torch.arange(score.shape[-1], device=score.device, dtype=score.dtype)
        tau = 1 - self.factor / (j + 2)
        tau[0] = -1.0
        fails = (sorted_s < tau) & valid
        first = torch.where(fails.any(-1), fails.float().argmax(-1), n - 1)
        k = first + ((first == 0) | (first == n - 1)).long()
        k = torch.where(n > 0, k, torch.zeros_like(k))
        return take_top(score, candidates, k)


@dataclass
class EntropyBoundPolicy:
    """EB-sampler (arXiv 2505.24857): sort candidates by entropy ascending and commit the largest
    prefix with sum(H) - max(H) <= gamma. The least uncertain candidate is always committed."""

    gamma: float
    uses_schedule: bool = False
    needs_entropy: bool = True

    def select(self, score, entropy, candidates, quota, step, generator):
        sorted_h, valid, _ = _sorted_candidates(entropy, candidates, descending=False)
        sorted_h = torch.where(valid, sorted_h, torch.zeros_like(sorted_h))
        # ascending order: the max of a prefix is its last element
        ok = (torch.cumsum(sorted_h, -1) - sorted_h <= self.gamma) & valid
        k = ok.sum(-1)
        return take_top(-entropy, candidates, k)


@dataclass
class BudgetPolicy:
    """Seed 004 eq. 9: with candidates sorted by confidence c, commit the largest prefix S with
    sum_{j in S}(1 - c_j) + max_{j in S}(1 - c_j) < f, at least one. f = 1 is the guarantee."""

    budget: float
    uses_schedule: bool = False
    needs_entropy: bool = False

    def select(self, score, entropy, candidates, quota, step, generator):
        sorted_s, valid, n = _sorted_candidates(score, candidates)
        u = torch.where(valid, 1 - sorted_s, torch.zeros_like(sorted_s))
        # descending confidence: the max of (1 - c) over a prefix is its last element
        ok = (torch.cumsum(u, -1) + u < self.budget) & valid
        k = torch.maximum(ok.sum(-1), (n > 0).long())
        return take_top(score, candidates, k)


@dataclass
class OriginPolicy:
    """Dream's "origin": each masked position is committed independently with probability
    1 - s/t (1 on the last step). Uniforms are drawn in row-major order over the candidates,
    as upstream draws them over the flattened masked positions."""

    schedule: DreamSchedule
    uses_schedule: bool = False
    needs_entropy: bool = False

    def select(self, score, entropy, candidates, quota, step, generator):
        if step >= self.schedule.steps - 1:
            return candidates.clone()
        frac = self.schedule.transfer_fraction(step)
        n = int(candidates.sum())
        u = torch.full(candidates.shape, 2.0, device=candidates.device)
        u[candidates] = torch.rand(n, generator=generator, device=candidates.device)
        return candidates & (u < frac.to(u.device))


POLICIES = ("fixed", "threshold", "factor", "entropy", "budget")


def make_policy(name: str, *, threshold: float, factor: float, gamma: float, budget: float) -> CommitPolicy:
    if name == "fixed":
        return FixedPolicy()
    if name == "threshold":
        return ThresholdPolicy(threshold)
    if name == "factor":
        return FactorPolicy(factor)
    if name == "entropy":
        return EntropyBoundPolicy(gamma)
    if name == "budget":
        return BudgetPolicy(budget)
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")
