"""What every commit policy shares: the protocol the engine calls (`select`, and `revise` for a
policy that edits or remasks committed tokens), the registry, the declarations a registered
policy makes besides `select` (`Registered`), what a revising policy sees (`Revision`), and the
top-k selection every schedule-driven policy uses."""

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

from unmask.knobs import Knob
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


class Registered:
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


def sorted_candidates(score: torch.Tensor, candidates: torch.Tensor, descending: bool = True):
    fill = -torch.inf if descending else torch.inf
    s = score.masked_fill(~candidates, fill)
    sorted_s = torch.sort(s, dim=-1, descending=descending).values
    n = candidates.sum(-1)
    valid = torch.arange(s.shape[-1], device=s.device)[None, :] < n[:, None]
    return sorted_s, valid, n


def make_policy(p: Any) -> CommitPolicy:
    """The commit policy that generation parameters `p` name (p.policy), built from its knob."""
    return POLICIES.lookup(p.policy).from_params(p)
