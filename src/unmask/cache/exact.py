"""The exact KV cache of a block-diffusion model (config bd_size): a finished block never sees a
later one, so its K/V are final once computed with its final tokens."""

from dataclasses import dataclass
from typing import ClassVar

import torch

from unmask.cache.base import CachePolicy, Plan, register


@register
@dataclass(frozen=True)
class ExactCache(CachePolicy):
    """One prefill (the prompt and the first block), then each step the open block only; the step
    after a block completes also recomputes that block with its final tokens (the seal forward,
    fused with the next block's first step: the window starts at the first column whose K/V is
    not yet exact, its counter `kv_done`)."""

    name: ClassVar[str] = "exact"
    suits: ClassVar[tuple[str, ...]] = ("block",)
    sub_block_cache: ClassVar[bool] = False  # also cache the open block between its sub-blocks
    # K/V exact before this column: the prompt's whole attention blocks once prefilled
    row_state: ClassVar[dict] = {"kv_done": lambda P, align: P // align * align}

    def prefix(self, P: int, align: int, shift: int) -> int:
        """The prompt's whole attention blocks (each sees no later block), less the column that
        scores the first answer position when logits are shifted."""
        return min(P // align * align, P - shift)

    def plan(self, rows, shift: int, align: int) -> Plan:
        s = rows.s
        first = (rows.step == 0) & (rows.block == 0)
        prefill = first & (rows.reused == 0)  # a reused prompt prefix: a window from its end instead
        whole = torch.ones_like(prefill) if not self.sub_block_cache else rows.step == 0
        attn_end = torch.minimum((s // align + 1) * align, rows.L)
        sub_start = torch.minimum(s // rows.blk * rows.blk, s - shift)  # with the prompt's end, in the first
        kv_done = rows.state["kv_done"]
        start = torch.where(whole, torch.minimum(kv_done, s - shift), sub_start)
        start = torch.where(first, rows.reused, start)
        end = torch.where(whole, attn_end, rows.e)
        finished = kv_done < s // align * align  # a block finished since its K/V were computed
        yes = torch.ones_like(prefill)
        return Plan(prefill, torch.where(prefill, 0, start), end, yes, ~prefill & finished, prefill.clone())

    def after(self, rows, ran, plan, doubted, committed, align) -> None:
        rows.state["kv_done"] = torch.where(ran, rows.s // align * align, rows.state["kv_done"])
