"""The exact KV cache of a causal model (the AR twin): every key is final once written."""

from dataclasses import dataclass
from typing import ClassVar

import torch

from unmask.cache.base import CachePolicy, Plan, register


@register
@dataclass(frozen=True)
class CausalCache(CachePolicy):
    """One prefill of the prompt, then each step the window [t - 1, t): the token committed last
    step, whose K/V are written now and whose hidden state scores position t (blocks are one
    token long; the masked position t itself is never fed: no causal query before it could see it)."""

    name: ClassVar[str] = "causal"
    suits: ClassVar[tuple[str, ...]] = ("causal",)

    def plan(self, rows, shift: int, align: int) -> Plan:
        prefill = (rows.step == 0) & (rows.block == 0)
        return Plan.window(rows, rows.s - shift, rows.s, full=prefill)
