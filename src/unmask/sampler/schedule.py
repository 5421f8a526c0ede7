"""Schedules: how many tokens a fixed-count policy commits at step i of a block. (Dream's
timestep schedule is part of its compat mode, in unmask.compat.)"""

from typing import Protocol

import torch


class Schedule(Protocol):
    def start_block(self, masked: torch.Tensor) -> None:
        """masked (B,): masked positions per row at the start of the block."""

    def quota(self, step: int, remaining: torch.Tensor) -> torch.Tensor:
        """(B,) tokens to commit at `step` given `remaining` (B,) masked candidates."""

    def select_rows(self, keep: torch.Tensor) -> None:
        """Drop finished rows: keep (B_new,) indices into the current rows."""


class EvenSchedule:
    """LLaDA's schedule: n masks over `steps` steps, floor(n/steps) each, the remainder first."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.table: torch.Tensor | None = None

    def start_block(self, masked: torch.Tensor) -> None:
        base = masked // self.steps
        rem = masked % self.steps
        extra = torch.arange(self.steps, device=masked.device)[None, :] < rem[:, None]
        self.table = base[:, None] + extra.long()

    def quota(self, step: int, remaining: torch.Tensor) -> torch.Tensor:
        if step >= self.steps:  # only reachable when a quota could not be met: finish the block
            return remaining
        return self.table[:, step]

    def select_rows(self, keep: torch.Tensor) -> None:
        if self.table is not None:
            self.table = self.table[keep]
