"""The EB-sampler's entropy bound."""

from dataclasses import dataclass
from typing import ClassVar

import torch

from unmask.knobs import NON_NEGATIVE, Knob
from unmask.sampler.policy.base import Registered, register, sorted_candidates, take_top


@register
@dataclass
class EntropyBoundPolicy(Registered):
    """EB-sampler (arXiv 2505.24857): sort candidates by entropy ascending and commit the largest
    prefix with sum(H) - max(H) <= gamma. The least uncertain candidate is always committed."""

    name: ClassVar[str] = "entropy"
    knob: ClassVar[str] = "gamma"
    bench_knob: ClassVar[str] = "gamma"
    fields: ClassVar[dict] = {"gamma": Knob(0.1, float, "entropy policy and compat diffusion-gemma: entropy bound "
                                            "(accept the lowest-entropy positions while the sum of their entropies "
                                            "minus the largest is at most this)", NON_NEGATIVE, from_model=True)}
    needs_entropy: ClassVar[bool] = True
    gamma: float

    def select(self, score, entropy, candidates, quota, step, generator):
        sorted_h, valid, _ = sorted_candidates(entropy, candidates, descending=False)
        sorted_h = torch.where(valid, sorted_h, torch.zeros_like(sorted_h))
        # ascending order: the max of a prefix is its last element
        ok = (torch.cumsum(sorted_h, -1) - sorted_h <= self.gamma) & valid
        k = ok.sum(-1)
        return take_top(-entropy, candidates, k)
