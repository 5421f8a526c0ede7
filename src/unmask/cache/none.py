"""No cache: every forward recomputes the whole canvas (exact; the reference samplers' default)."""

from dataclasses import dataclass
from typing import ClassVar

import torch

from unmask.cache.base import CachePolicy, Plan, register


@register
@dataclass(frozen=True)
class NoCache(CachePolicy):
    """Recompute the whole canvas every step; nothing is stored."""

    name: ClassVar[str] = "none"
    stores_kv: ClassVar[bool] = False
    suits: ClassVar[tuple[str, ...]] = ("full", "block", "causal")

    def plan(self, rows, shift: int, align: int) -> Plan:
        full = torch.ones_like(rows.s, dtype=torch.bool)
        return Plan.window(rows, rows.s, rows.T, full=full, kv=False)
