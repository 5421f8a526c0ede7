"""The adaptive cache: DualCache's windows, refreshed per row when a cheap signal says the cache
matters (issue 13; docs/decoding.md, "The adaptive cache")."""

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from unmask.cache.base import REFRESH_INTERVAL, CachePolicy, Plan, refresh_due, register
from unmask.knobs import UNIT, Knob, choices, positive_int


@register
@dataclass(frozen=True)
class AdaptiveCache(CachePolicy):
    """Two triggers, either, both, or neither given (then DEFAULT_TRIGGER):
    - refresh_tokens N: once the row has committed N tokens since its last full forward, its next
      step refreshes (planned before the step);
    - refresh_below c: a cached step that would commit a token whose cached probability is below
      c commits nothing from it; the row recomputes the step in the same engine step and commits
      from that (the window is wasted: two forwards, both counted).
    What a triggered refresh recomputes (`refresh_scope`): "canvas", a full forward (with a trigger
    that fires every step the decode is exactly `none`'s), or "suffix", the block and the masked
    suffix against the prefix K/V of the block start (then exactly PrefixCache's decode). The block
    start and `refresh_interval` steps are full refreshes either way. Rows decide alone."""

    name: ClassVar[str] = "adaptive"
    row_state: ClassVar[dict] = {"since": lambda P, align: 0}  # tokens committed since the last full forward
    fields: ClassVar[dict] = {
        "refresh_interval": REFRESH_INTERVAL,
        "refresh_tokens": Knob(None, int, "adaptive cache: refresh once N tokens were committed since the cached "
                               "K/V were computed", positive_int, from_model=True),
        "refresh_below": Knob(None, float, "adaptive cache: a cached step that would commit a token with "
                              "probability below this is recomputed (default 0.9)", UNIT, from_model=True),
        "refresh_scope": Knob(None, str, "adaptive cache: what a triggered refresh recomputes: suffix (the block "
                              "and the masked suffix, default) or canvas (a full forward)",
                              choices(("suffix", "canvas")), from_model=True),
    }
    SCOPES: ClassVar[tuple[str, ...]] = ("suffix", "canvas")
    DEFAULT_TRIGGER: ClassVar[dict] = {"refresh_below": 0.9}
    refresh_interval: int | None = None
    refresh_tokens: int | None = None
    refresh_below: float | None = None
    refresh_scope: str = "suffix"

    @classmethod
    def from_params(cls, p: Any) -> "AdaptiveCache":
        scope = p.refresh_scope or cls.refresh_scope
        if p.refresh_tokens is None and p.refresh_below is None:
            return cls(p.refresh_interval, refresh_scope=scope, **cls.DEFAULT_TRIGGER)
        return cls(p.refresh_interval, p.refresh_tokens, p.refresh_below, scope)

    @property
    def verifies(self) -> bool:
        return self.refresh_below is not None

    def plan(self, rows, shift: int, align: int) -> Plan:
        fresh = refresh_due(rows, self.refresh_interval)
        end = rows.e
        trig = torch.zeros_like(fresh)
        if self.refresh_tokens is not None:  # stale: tokens committed since the last refresh
            trig = (rows.state["since"] >= self.refresh_tokens) & ~fresh
            if self.refresh_scope == "canvas":
                fresh = fresh | trig
            else:  # the block and the masked suffix against the block start's prefix K/V
                end = torch.where(trig, rows.T, end)
        plan = Plan.window(rows, rows.s - shift, end, full=fresh)
        plan.reset = plan.reset | trig
        return plan

    def doubts(self, prob: torch.Tensor, commit: torch.Tensor) -> torch.Tensor:
        return (commit & (prob < self.refresh_below)).any(-1)

    def recompute(self, rows, shift: int) -> Plan:
        full = torch.full_like(rows.s, self.refresh_scope == "canvas", dtype=torch.bool)
        return Plan.window(rows, rows.s - shift, rows.T, full=full)

    def after(self, rows, ran, plan, doubted, committed, align) -> None:
        since = rows.state["since"]
        rows.state["since"] = torch.where(ran, torch.where(plan.reset | doubted, 0, since) + committed, since)
