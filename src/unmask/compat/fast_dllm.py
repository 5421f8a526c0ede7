"""Fast-dLLM v1's samplers (no cache, prefix cache, dual cache)."""

import torch

from unmask.compat.base import CompatMode, gumbel_proposal, register, topk_rows
from unmask.sampler.policy import FactorPolicy, make_policy
from unmask.sampler.schedule import EvenSchedule


@register
class FastDLLM(CompatMode):
    """Fast-dLLM v1 (latest) `generate`, `generate_with_prefix_cache`, `generate_with_dual_cache`."""

    name = "fast-dllm"
    reference = "the LLaDA sampler of Fast-dLLM v1"
    family = "llada"
    also = ("llada_moe",)
    takes_suffix = True
    policies = ("fixed", "threshold", "factor")
    caches = ("none", "prefix", "dual")

    def parts(self, p, mask_id):
        # fixed: a descending sort of the full row, first k (the latest get_transfer_index); factor:
        # torch.topk per row; threshold: argmax, which picks the first of equal maxima on any row
        policy = FactorPolicy(p.factor, top=topk_rows) if p.policy == "factor" else make_policy(p)
        # the factor path draws float32 uniforms for 'random'; get_transfer_index float64
        random_dtype = torch.float32 if p.policy == "factor" else torch.float64
        proposal = gumbel_proposal(p, mask_id, torch.float64, random_dtype, policy.needs_entropy)
        return proposal, policy, EvenSchedule(p.steps_per_block)
