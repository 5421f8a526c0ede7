"""Fast-dLLM's confidence threshold."""

from dataclasses import dataclass
from typing import ClassVar

import torch

from unmask.knobs import UNIT, Knob
from unmask.sampler.policy.base import Registered, register


@register
@dataclass
class ThresholdPolicy(Registered):
    """Fast-dLLM: every candidate with confidence >= threshold, plus the most confident one."""

    name: ClassVar[str] = "threshold"
    knob: ClassVar[str] = "threshold"
    bench_knob: ClassVar[str] = "threshold"
    fields: ClassVar[dict] = {"threshold": Knob(0.9, float, "threshold policy: commit every candidate with "
                                                "confidence >= this", UNIT, from_model=True)}
    threshold: float

    def select(self, score, entropy, candidates, quota, step, generator):
        commit = candidates & (score >= self.threshold)
        s = score.masked_fill(~candidates, -torch.inf)
        best = torch.zeros_like(commit).scatter_(-1, s.argmax(-1, keepdim=True), True)
        return commit | (best & candidates)
