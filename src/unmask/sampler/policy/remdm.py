"""ReMDM's remasking."""

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from unmask.knobs import UNIT, Knob, choices
from unmask.sampler.policy.base import Registered, Revision, register, take_top


REMDM_STRATEGIES = ("cap", "rescale", "conf")


@register
@dataclass
class ReMDMPolicy(Registered):
    """ReMDM remasking (Wang et al. 2025, kuleshov-group/remdm `_ddpm_caching_update`), on the
    engine's blocks: tokens are committed as the fixed schedule commits them (its quota, most
    confident first), and before that a committed token of the open block goes back to MASK with
    probability sigma. Inside a block of N steps the schedule is the linear one, alpha = i / N before
    step i and (i + 1) / N after, and sigma_max = min(1, (1 - alpha_s) / alpha_t):
    cap sigma = min(eta, sigma_max); rescale sigma = eta * sigma_max; conf sigma_i = sigma_max *
    softmax over the block's committed tokens of (-p_i), p_i the probability the token had when it
    was committed (lower confidence, likelier remasked). sigma_max is 0 at the block's last step, so
    nothing is remasked there; if remasked positions outnumber the last step's quota, the block
    takes one more step that commits the rest (the schedule's overflow rule). Remasked positions
    rejoin the candidates; the prompt and earlier blocks are never touched. ReMDM's `loop`
    strategy (a fixed-alpha phase between t_on and t_off) is not implemented."""

    name: ClassVar[str] = "remdm"
    knob: ClassVar[str] = "remask_eta"
    bench_knob: ClassVar[str] = "eta"
    fields: ClassVar[dict] = {
        "remask_eta": Knob(None, float, "remdm policy: ReMDM's eta, the remasking probability bound (default 0.05)",
                           UNIT),
        "remask_strategy": Knob(None, str, "remdm policy: how sigma is set: cap (default), rescale or conf",
                                choices(REMDM_STRATEGIES)),
    }
    uses_schedule: ClassVar[bool] = True
    revises: ClassVar[bool] = True
    needs_uniform: ClassVar[bool] = True
    eta: float
    strategy: str = "cap"

    @classmethod
    def implied_by(cls) -> tuple[str, ...]:
        return ("remask_eta", "remask_strategy")

    @classmethod
    def from_params(cls, p: Any) -> "ReMDMPolicy":
        return cls(0.05 if p.remask_eta is None else p.remask_eta, p.remask_strategy or "cap")

    def select(self, score, entropy, candidates, quota, step, generator):
        return take_top(score, candidates, quota)

    def revise(self, r: Revision):
        n = r.steps.clamp(min=1).to(r.prob.dtype)
        alpha_t, alpha_s = r.step / n, ((r.step + 1) / n).clamp(max=1.0)
        sigma_max = torch.where(alpha_t > 0, ((1 - alpha_s) / alpha_t.clamp(min=1e-12)).clamp(max=1.0), 0.0)[:, None]
        if self.strategy == "cap":
            sigma = sigma_max.clamp(max=self.eta).expand_as(r.prob)
        elif self.strategy == "rescale":
            sigma = (self.eta * sigma_max).expand_as(r.prob)
        else:  # conf: softmax of -p over the committed tokens of the block
            w = torch.softmax((-r.commit_conf).masked_fill(~r.editable, -torch.inf), dim=-1).nan_to_num(0.0)
            sigma = w * sigma_max
        return None, r.editable & (r.uniform < sigma)
