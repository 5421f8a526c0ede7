"""Seed 004's error budget."""

from dataclasses import dataclass
from typing import ClassVar

import torch

from unmask.knobs import POSITIVE, Knob
from unmask.sampler.policy.base import Registered, register, sorted_candidates, take_top


@register
@dataclass
class BudgetPolicy(Registered):
    """Seed 004 eq. 9: with candidates sorted by confidence c, commit the largest prefix S with
    sum_{j in S}(1 - c_j) + max_{j in S}(1 - c_j) < f, at least one. f = 1 is the guarantee."""

    name: ClassVar[str] = "budget"
    knob: ClassVar[str] = "budget"
    bench_knob: ClassVar[str] = "budget"
    fields: ClassVar[dict] = {"budget": Knob(1.0, float, "budget policy: error budget f", POSITIVE, from_model=True)}
    budget: float

    def select(self, score, entropy, candidates, quota, step, generator):
        sorted_s, valid, n = sorted_candidates(score, candidates)
        u = torch.where(valid, 1 - sorted_s, torch.zeros_like(sorted_s))
        # descending confidence: the max of (1 - c) over a prefix is its last element
        ok = (torch.cumsum(u, -1) + u < self.budget) & valid
        k = torch.maximum(ok.sum(-1), (n > 0).long())
        return take_top(score, candidates, k)
