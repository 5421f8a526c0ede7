"""The parts the decode loop composes, built from checked GenerationParams: proposal
configuration, commit policy, schedule, cache policy, and the loop rules (native, or those of a
compat mode from unmask.compat)."""

from dataclasses import dataclass

import torch

from unmask.cache.policy import CachePolicy, make_cache_policy
from unmask.compat import NATIVE, LoopRules, get_mode
from unmask.models.base import TokenIds
from unmask.params import GenerationParams
from unmask.sampler.policy import CommitPolicy, make_policy
from unmask.sampler.proposal import ProposalConfig
from unmask.sampler.schedule import EvenSchedule, Schedule


@dataclass
class DecodeParts:
    proposal: ProposalConfig
    policy: CommitPolicy
    schedule: Schedule
    cache: CachePolicy
    rules: LoopRules


def build_parts(p: GenerationParams, tokens: TokenIds) -> DecodeParts:
    cache = make_cache_policy(p)
    if p.compat is not None:
        mode = get_mode(p.compat)
        proposal, policy, schedule = mode.parts(p, tokens.mask)
        return DecodeParts(proposal, policy, schedule, cache, mode.rules)
    policy = make_policy(p)
    proposal = ProposalConfig(
        mask_id=tokens.mask,
        temperature=p.temperature,
        top_k=p.top_k,
        top_p=p.top_p,
        confidence="random" if p.remasking == "random" else p.confidence,
        precision=torch.float32,
        need_entropy=policy.needs_entropy,
    )
    rules = NATIVE if p.early_stop else LoopRules(early_stop=False)
    return DecodeParts(proposal, policy, EvenSchedule(p.steps_per_block), cache, rules)
