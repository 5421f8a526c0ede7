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

    def prefix(self, P: int, align: int, shift: int) -> int:
        """Every key is final once written; the prompt's last column scores the first answer
        position, so it is computed."""
        return P - shift

    def plan(self, rows, shift: int, align: int) -> Plan:
        first = (rows.step == 0) & (rows.block == 0)
        prefill = first & (rows.reused == 0)  # a reused prompt prefix: a window from its end instead
        return Plan.window(rows, torch.where(first, rows.reused, rows.s - shift), rows.s, full=prefill)
