"""The parts a request's rows are decoded with, built once from its checked GenerationParams:
the proposal configuration, the commit policy, the cache policy and whether the row stops at its
end of text."""

from dataclasses import dataclass

import torch

from unmask.cache import CachePolicy, make_cache_policy
from unmask.models.base import TokenIds
from unmask.params import GenerationParams
from unmask.sampler.policy import CommitPolicy, make_policy
from unmask.sampler.proposal import ProposalConfig


@dataclass
class DecodeParts:
    proposal: ProposalConfig
    policy: CommitPolicy
    cache: CachePolicy
    early_stop: bool


def build_parts(p: GenerationParams, tokens: TokenIds) -> DecodeParts:
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
    return DecodeParts(proposal, policy, make_cache_policy(p), p.early_stop)
