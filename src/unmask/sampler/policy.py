"""Commit policies: which masked candidates receive their final token this step.

All policies are batched over rows: inputs are (B, W) tensors whose non-candidate entries are
ignored; output is a (B, W) bool tensor that is a subset of the candidates. Every policy commits
at least one token in a row that has a candidate and a positive quota.

Each policy declares, in its class, its name, the generation parameters it reads (`fields`, as
unmask.knobs.Knob: default, type, help, range), the one that tunes it (its knob) and how it is
built from the parameters; `@register` adds it to POLICIES. The CLI flags, the bench
grid and the lm-eval arguments are derived from that, so a new policy is one class here.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch

from unmask.knobs import NON_NEGATIVE, POSITIVE, UNIT, Knob, choices, non_negative_int
from unmask.registry import Registry


class CommitPolicy(Protocol):
    uses_schedule: bool  # does it consume the schedule's per-step quota?
    needs_entropy: bool
    # does it also revise committed tokens (edit or remask: `revise`)? Such a policy's block may
    # take `post_steps` more steps once no mask is left, and stays open while it edits
    revises: bool

    def select(
        self,
        score: torch.Tensor,
        entropy: torch.Tensor | None,
        candidates: torch.Tensor,
        quota: torch.Tensor | None,
        step: int,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        ...


POLICIES = Registry("policy")
register = POLICIES.register


class _Registered:
    """What a registered policy declares besides `select`.

    name: the value of `--policy`. fields: the generation parameters it declares (GenerationParams
    is built from every component's). knob: the one that tunes it, or None. bench_knob: what the
    number in a bench grid entry `name:VALUE` means.
    """

    name: ClassVar[str]
    fields: ClassVar[dict[str, Knob]] = {}
    knob: ClassVar[str | None] = None
    bench_knob: ClassVar[str] = ""
    uses_schedule: ClassVar[bool] = False
    needs_entropy: ClassVar[bool] = False
    revises: ClassVar[bool] = False
    post_steps: ClassVar[int] = 0
    reads: ClassVar[tuple[str, ...]] = ()  # other policies' knobs it also reads (they do not imply it)

    needs_uniform: ClassVar[bool] = False  # does `revise` draw (Revision.uniform)?

    def revise(self, r: "Revision") -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """For a revising policy: (edit, remask), each (B, W) bool or None. An edit writes the
        proposal over a committed token; a remask puts MASK back (the position is a candidate
        again). The engine applies both only to `r.editable` columns."""
        return None, None

    @classmethod
    def implied_by(cls) -> tuple[str, ...]:
        """Generation parameters that, given alone, mean this policy."""
        return () if cls.knob is None else (cls.knob,)

    @classmethod
    def from_params(cls, p: Any) -> "CommitPolicy":
        """Build from generation parameters (anything with the knob as an attribute)."""
        return cls(getattr(p, cls.knob))

    @classmethod
    def bench_params(cls, value: float, gen_length: int) -> dict:
        """The generation parameters that a bench grid entry `name:value` stands for."""
        return {"policy": cls.name, cls.knob: value}


@dataclass
class Revision:
    """What a revising policy sees of one step, (B, W) over the open block's window unless noted."""

    prob: torch.Tensor  # the probability of each proposal
    tokens: torch.Tensor  # the proposals
    current: torch.Tensor  # the canvas before this step
    editable: torch.Tensor  # committed (not masked), non-prompt columns before this step
    committed: torch.Tensor  # this step's commits
    step: torch.Tensor  # (B,) the step inside the block (0 = its first)
    steps: torch.Tensor  # (B,) the block's scheduled steps
    commit_conf: torch.Tensor  # the probability each committed token had when it was committed
    uniform: torch.Tensor | None = None  # U(0, 1) draws, one per column (policies with needs_uniform)


def take_top(score: torch.Tensor, candidates: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The k[b] highest-scoring candidates of each row b: a descending sort of the row with
    non-candidates at -inf, first k. Among exactly equal scores the sort decides, which depends on
    the row's length (native modes pass the window [block start or prompt end, block end); compat
    modes pass the reference's own row and, where the reference calls torch.topk, its selector)."""
    s = score.masked_fill(~candidates, -torch.inf)
    order = torch.sort(s, dim=-1, descending=True).indices
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(s.shape[-1], device=s.device).expand_as(order))
    return (rank < k[:, None]) & candidates


def _sorted_candidates(score: torch.Tensor, candidates: torch.Tensor, descending: bool = True):
    fill = -torch.inf if descending else torch.inf
    s = score.masked_fill(~candidates, fill)
    sorted_s = torch.sort(s, dim=-1, descending=descending).values
    n = candidates.sum(-1)
    valid = torch.arange(s.shape[-1], device=s.device)[None, :] < n[:, None]
    return sorted_s, valid, n


@register
@dataclass
class FixedPolicy(_Registered):
    """LLaDA: commit the schedule's quota, most confident first (or in random order when the
    score is a random draw). Its knob is the schedule (`steps`), not a policy parameter."""

    name: ClassVar[str] = "fixed"
    bench_knob: ClassVar[str] = "tokens per step"
    uses_schedule: ClassVar[bool] = True
    fields: ClassVar[dict] = {"remasking": Knob("low_confidence", str, "fixed policy's order: most confident first, "
                                                "or random", choices(("low_confidence", "random")), from_model=True)}
    top: Callable = field(default=take_top, repr=False)  # how the k best are picked (compat: the reference's call)

    @classmethod
    def implied_by(cls) -> tuple[str, ...]:
        return ("steps", "remasking")

    @classmethod
    def from_params(cls, p: Any) -> "FixedPolicy":
        return cls()

    @classmethod
    def bench_params(cls, value: float, gen_length: int) -> dict:
        k = int(value)
        if k != value or k < 1 or gen_length % k:
            raise ValueError(f"fixed:{value:g}: tokens per step must be an integer that divides gen_length {gen_length}")
        return {"policy": cls.name, "steps": gen_length // k}

    def select(self, score, entropy, candidates, quota, step, generator):
        return self.top(score, candidates, quota)


@register
@dataclass
class ThresholdPolicy(_Registered):
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


@register
@dataclass
class EditPolicy(_Registered):
    """Mask-to-token plus token-to-token editing (LLaDA2.1): commit as the threshold policy does
    (every candidate with confidence >= threshold, plus the most confident), and in the same step
    replace each committed token of the open block whose proposal differs with probability above
    `edit_threshold`. Once the block has no mask, up to `max_post_steps` more steps edit it; the
    block ends at the first of them that edits nothing. Edits stay inside the open block (earlier
    blocks, and so every cache of them, are never touched); the prompt is never edited."""

    name: ClassVar[str] = "edit"
    knob: ClassVar[str] = "edit_threshold"
    bench_knob: ClassVar[str] = "edit threshold"
    fields: ClassVar[dict] = {
        "edit_threshold": Knob(None, float, "edit policy (and compat llada2): replace a committed token of the open "
                               "block by the model's argmax when that differs with probability above this "
                               "(token-to-token editing)", UNIT),
        "max_post_steps": Knob(16, int, "edit policy: editing steps a block may take after its last mask is "
                               "committed", non_negative_int),
    }
    revises: ClassVar[bool] = True
    threshold: float
    edit_threshold: float
    post_steps: int = 16

    reads: ClassVar[tuple[str, ...]] = ("threshold",)

    @classmethod
    def implied_by(cls) -> tuple[str, ...]:
        return ("edit_threshold", "max_post_steps")

    @classmethod
    def from_params(cls, p: Any) -> "EditPolicy":
        return cls(p.threshold, DEFAULT_EDIT_THRESHOLD if p.edit_threshold is None else p.edit_threshold,
                   p.max_post_steps)

    def select(self, score, entropy, candidates, quota, step, generator):
        return ThresholdPolicy(self.threshold).select(score, entropy, candidates, quota, step, generator)

    def revise(self, r: Revision):
        return r.editable & (r.prob > self.edit_threshold) & (r.tokens != r.current), None


DEFAULT_EDIT_THRESHOLD = 0.9  # LLaDA2.1's generate default (its "quality mode" recommends 0.5 with threshold 0.7)


REMDM_STRATEGIES = ("cap", "rescale", "conf")


@register
@dataclass
class ReMDMPolicy(_Registered):
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


@register
@dataclass
class FactorPolicy(_Registered):
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
        sorted_s, valid, n = _sorted_candidates(score, candidates)
        j = torch.arange(score.shape[-1], device=score.device, dtype=score.dtype)
        tau = 1 - self.factor / (j + 2)
        tau[0] = -1.0
        fails = (sorted_s < tau) & valid
        first = torch.where(fails.any(-1), fails.float().argmax(-1), n - 1)
        k = first + ((first == 0) | (first == n - 1)).long()
        k = torch.where(n > 0, k, torch.zeros_like(k))
        return self.top(score, candidates, k)


@register
@dataclass
class EntropyBoundPolicy(_Registered):
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
        sorted_h, valid, _ = _sorted_candidates(entropy, candidates, descending=False)
        sorted_h = torch.where(valid, sorted_h, torch.zeros_like(sorted_h))
        # ascending order: the max of a prefix is its last element
        ok = (torch.cumsum(sorted_h, -1) - sorted_h <= self.gamma) & valid
        k = ok.sum(-1)
        return take_top(-entropy, candidates, k)


@register
@dataclass
class BudgetPolicy(_Registered):
    """Seed 004 eq. 9: with candidates sorted by confidence c, commit the largest prefix S with
    sum_{j in S}(1 - c_j) + max_{j in S}(1 - c_j) < f, at least one. f = 1 is the guarantee."""

    name: ClassVar[str] = "budget"
    knob: ClassVar[str] = "budget"
    bench_knob: ClassVar[str] = "budget"
    fields: ClassVar[dict] = {"budget": Knob(1.0, float, "budget policy: error budget f", POSITIVE, from_model=True)}
    budget: float

    def select(self, score, entropy, candidates, quota, step, generator):
        sorted_s, valid, n = _sorted_candidates(score, candidates)
        u = torch.where(valid, 1 - sorted_s, torch.zeros_like(sorted_s))
        # descending confidence: the max of (1 - c) over a prefix is its last element
        ok = (torch.cumsum(u, -1) + u < self.budget) & valid
        k = torch.maximum(ok.sum(-1), (n > 0).long())
        return take_top(score, candidates, k)


def make_policy(p: Any) -> CommitPolicy:
    """The commit policy that generation parameters `p` name (p.policy), built from its knob."""
    return POLICIES.lookup(p.policy).from_params(p)
