"""Turn validated GenerationParams into the parts the loop composes: proposal configuration,
commit policy, schedule, cache policy and the compat-mode switches."""

from dataclasses import dataclass

import torch

from unmask.cache.policy import CachePolicy, make_cache_policy
from unmask.models.base import TokenIds
from unmask.params import GenerationParams
from unmask.sampler.policy import CommitPolicy, FixedPolicy, OriginPolicy, make_policy
from unmask.sampler.proposal import ProposalConfig
from unmask.sampler.schedule import DreamSchedule, EvenSchedule, Schedule

_DREAM_CONFIDENCE = {"origin": "prob", "maskgit_plus": "prob", "topk_margin": "margin", "entropy": "neg_entropy"}


@dataclass(frozen=True)
class LoopRules:
    """How the loop deviates from unmask's native semantics to reproduce a reference."""

    # at a full-canvas forward, candidates are all masks before the block end (not only the block)
    candidates_before_block_end: bool = False
    # run exactly steps_per_block forwards per block, even after the block is complete
    run_all_steps: bool = False
    # score the whole recomputed window, so random draws have the reference's shapes
    score_full_window: bool = False
    early_stop: bool = True


@dataclass
class DecodeParts:
    proposal: ProposalConfig
    policy: CommitPolicy
    schedule: Schedule
    cache: CachePolicy
    rules: LoopRules


def build_parts(p: GenerationParams, tokens: TokenIds) -> DecodeParts:
    cache = make_cache_policy(p.cache, p.refresh_interval)
    confidence = "random" if p.remasking == "random" else p.confidence
    if p.compat == "dream":
        schedule = DreamSchedule(p.total_steps, p.eps)
        policy = OriginPolicy(schedule) if p.alg == "origin" else FixedPolicy()
        proposal = ProposalConfig(
            mask_id=tokens.mask,
            temperature=p.temperature,
            top_k=p.top_k,
            top_p=p.top_p,
            confidence=_DREAM_CONFIDENCE[p.alg],
            sampling="categorical",
        )
        rules = LoopRules(candidates_before_block_end=True, run_all_steps=True, score_full_window=True, early_stop=False)
        return DecodeParts(proposal, policy, schedule, cache, rules)

    policy = make_policy(p.policy, threshold=p.threshold, factor=p.factor, gamma=p.gamma, budget=p.budget)
    schedule = EvenSchedule(p.steps_per_block)
    exact = p.compat is not None
    # Fast-dLLM's factor path and LLaDA draw float32 uniforms; Fast-dLLM's other paths float64
    random_dtype = torch.float64 if (p.compat == "fast-dllm" and p.policy != "factor") else torch.float32
    proposal = ProposalConfig(
        mask_id=tokens.mask,
        temperature=p.temperature,
        top_k=p.top_k,
        top_p=p.top_p,
        confidence=confidence,
        sampling="gumbel",
        precision=torch.float64 if p.compat == "fast-dllm" else torch.float32,
        random_dtype=random_dtype,
        exact_softmax=exact,
        need_entropy=policy.needs_entropy,
    )
    rules = LoopRules(
        candidates_before_block_end=exact,
        run_all_steps=p.compat == "llada",
        score_full_window=exact,
        early_stop=p.early_stop,
    )
    return DecodeParts(proposal, policy, schedule, cache, rules)
