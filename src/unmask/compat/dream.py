"""Dream's `diffusion_generate` and Open-dCoder's (Dream's sampler with p2)."""

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from unmask.compat.base import CompatMode, register, topk_rows
from unmask.errors import UnmaskError
from unmask.knobs import NON_NEGATIVE, Knob, choices, interval
from unmask.sampler.policy import FixedPolicy
from unmask.sampler.proposal import ProposalConfig

DREAM_ALGS = {"origin": "prob", "maskgit_plus": "prob", "topk_margin": "margin", "entropy": "neg_entropy"}


OPEN_DCODER_ALGS = (*DREAM_ALGS, "p2")


# Dream's and Open-dCoder's samplers share their algorithm and timestep floor (one knob each)
ALG = Knob(None, str, "the sampler's algorithm, with compat dream (origin, maskgit_plus, topk_margin, entropy) or "
           "open-dcoder (also p2)", choices(OPEN_DCODER_ALGS))


EPS = Knob(1e-3, float, "Dream's / Open-dCoder's timestep floor, with compat dream or open-dcoder",
           interval(0, 1, hi_open=True))


@register
class Dream(CompatMode):
    """Dream's `diffusion_generate`: the whole canvas as one block, Dream's timestep schedule, the
    algorithms origin / maskgit_plus / topk_margin / entropy, categorical sampling."""

    name = "dream"
    reference = "Dream's diffusion_generate"
    family = "dream"
    takes_suffix = True
    policies = ("fixed",)
    caches = ("none",)
    top_k_top_p = True
    equal_length_prompts = False
    rules = replace(CompatMode.rules, run_all_steps=True)
    fields: ClassVar[dict] = {"alg": ALG, "eps": EPS}

    def resolve(self, p):
        return replace(p, block_length=p.gen_length, alg=p.alg or "origin")

    def check(self, p, subject=None):
        if p.alg not in DREAM_ALGS:
            raise UnmaskError(f"unknown alg {p.alg!r}; choose one of {', '.join(DREAM_ALGS)}")
        if p.policy != "fixed":
            raise UnmaskError(f"compat 'dream' does not support policy {p.policy!r} (choose the algorithm with alg)")
        self._need(p, p.remasking == "low_confidence", f"remasking {p.remasking!r}", subject)
        super().check(p, subject)

    def parts(self, p, mask_id):
        schedule = DreamSchedule(p.total_steps, p.eps)
        policy = OriginPolicy(schedule) if p.alg == "origin" else FixedPolicy(top=topk_rows)
        proposal = ProposalConfig(mask_id=mask_id, temperature=p.temperature, top_k=p.top_k, top_p=p.top_p,
                                  confidence=DREAM_ALGS[p.alg], sampling="categorical")
        return proposal, policy, schedule


class DreamSchedule:
    """Dream's schedule: timesteps linspace(1, eps, steps+1); at step i commit
    int(remaining * (1 - s/t)) with t, s = ts[i], ts[i+1] (float32 as upstream), all on the last step."""

    def __init__(self, steps: int, eps: float = 1e-3) -> None:
        self.steps = steps
        self.timesteps = torch.linspace(1, eps, steps + 1)

    def start_block(self, masked: torch.Tensor) -> None:
        pass

    def transfer_fraction(self, step: int) -> torch.Tensor:
        t, s = self.timesteps[step], self.timesteps[step + 1]
        return 1 - s / t

    def quota(self, step: int, remaining: torch.Tensor) -> torch.Tensor:
        if step >= self.steps - 1:
            return remaining
        frac = self.transfer_fraction(step).to(remaining.device)
        return (remaining.float() * frac).long()

    def select_rows(self, keep: torch.Tensor) -> None:
        pass


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


@register
class OpenDCoder(CompatMode):
    """Open-dCoder's `diffusion_generate` (pengzhangzhi/Open-dLLM,
    veomni/models/transformers/qwen2/generation_utils.py) on an Open-dCoder checkpoint: the whole
    canvas as one block, Dream's timesteps, the algorithms origin, maskgit_plus, topk_margin,
    entropy and p2 (which masks the least confident generated tokens again each step), greedy or
    sampled (temperature, top_p, top_k, alg_temp); infilling as its eval does it (prompt, masks,
    suffix). Loop: unmask.reference.open_dcoder."""

    name = "open-dcoder"
    reference = "Open-dCoder's diffusion_generate"
    family = "open_dcoder"
    policies = ("fixed",)
    caches = ("none",)
    loop = "open-dcoder"
    takes_suffix = True
    top_k_top_p = True
    fields: ClassVar[dict] = {"alg": ALG, "eps": EPS, "alg_temp": Knob(
        None, float, "compat open-dcoder: Gumbel temperature of the positions maskgit_plus, topk_margin and entropy "
        "pick (0: the most confident)", NON_NEGATIVE)}

    def resolve(self, p):
        return replace(p, block_length=p.gen_length, alg=p.alg or "entropy")  # MDMGenerationConfig's default

    def check(self, p, subject=None):
        self._need(p, p.remasking == "low_confidence", f"remasking {p.remasking!r} (set alg)", subject)
        super().check(p, subject)
