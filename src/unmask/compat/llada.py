"""LLaDA's own `generate`."""

from dataclasses import replace

import torch

from unmask.compat.base import CompatMode, gumbel_proposal, register, topk_rows
from unmask.sampler.policy import FixedPolicy
from unmask.sampler.schedule import EvenSchedule


@register
class LLaDA(CompatMode):
    """LLaDA's official `generate`: fixed steps, every step run even when nothing is left."""

    name = "llada"
    reference = "the LLaDA sampler"
    family = "llada"
    also = ("llada_moe",)  # LLaDA-MoE's release decodes with LLaDA's generate
    takes_suffix = True
    policies = ("fixed",)
    caches = ("none",)
    rules = replace(CompatMode.rules, run_all_steps=True)

    def parts(self, p, mask_id):
        proposal = gumbel_proposal(p, mask_id, torch.float32, torch.float32, False)
        return proposal, FixedPolicy(top=topk_rows), EvenSchedule(p.steps_per_block)
