"""A two-interval cache after dLLM-Cache (Liu et al., 2025): the prompt's K/V are refreshed
rarely, the response's often, and in between only the open block is recomputed."""

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from unmask.cache.base import REFRESH_INTERVAL, CachePolicy, Plan, register


@register
@dataclass(frozen=True)
class DLLMCache(CachePolicy):
    """Counting the row's steps from its first forward (not from each block start, as DualCache
    does): a full forward at step 0 and every `prompt_interval` steps; every `refresh_interval`
    steps (default 2) the whole response [P, L) is recomputed against the cached prompt; other
    steps recompute the open block only. Unlike DualCache the prompt is not recomputed at every
    block start, which is what it saves on long prompts; the response refresh keeps the masked
    suffix from going as stale as DualCache's. dLLM-Cache also refreshes the tokens whose values
    changed most (its adaptive partial update); that part is not reproduced here."""

    name: ClassVar[str] = "dllm-cache"
    fields: ClassVar[dict] = {"refresh_interval": REFRESH_INTERVAL}
    PROMPT_INTERVAL: ClassVar[int] = 16
    refresh_interval: int = 2
    prompt_interval: int = PROMPT_INTERVAL

    @classmethod
    def from_params(cls, p: Any) -> "DLLMCache":
        return cls(p.refresh_interval or cls.refresh_interval)

    def plan(self, rows, shift: int, align: int) -> Plan:
        age = rows.age  # the row's steps so far
        full = age % self.prompt_interval == 0
        response = age % self.refresh_interval == 0
        start = torch.where(response, rows.P, rows.s) - shift
        end = torch.where(response, rows.L, rows.e)
        return Plan.window(rows, start, end, full=full)
