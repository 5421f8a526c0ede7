"""Fast-dLLM's factor rule."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from unmask.knobs import POSITIVE, Knob
from unmask.sampler.policy.base import Registered, register, sorted_candidates, take_top


@register
@dataclass
class FactorPolicy(Registered):
    """Fast-dLLM's factor rule: the n-th most confident candidate passes if c >= 1 - f/(n+1).
    The first failing rank j bounds the commit count, with upstream's edge cases: j = 0 or
    j = N-1 (including "nothing failed") commit one more, so N <= 2 commits everything."""

    name: ClassVar[str] = "factor"
    knob: ClassVar[str] = "factor"
    bench_knob: ClassVar[str] = "factor"
    fields: ClassVar[dict] = {"factor": Knob(1.0, float, "factor policy: f", POSITIVE, from_model=True)}
    factor: float
    top: Callable = field(default=take_top, repr=False)

    def select(self, score, entropy, candidates, quota, step, generator):
        sorted_s, valid, n = sorted_candidates(score, candidates)
        j = torch.arange(score.shape[-1], device=score.device, dtype=score.dtype)
        tau = 1 - self.factor / (j + 2)
        tau[0] = -1.0
        fails = (sorted_s < tau) & valid
        first = torch.where(fails.any(-1), fails.float().argmax(-1), n - 1)
        k = first + ((first == 0) | (first == n - 1)).long()
        k = torch.where(n > 0, k, torch.zeros_like(k))
        return self.top(score, candidates, k)
