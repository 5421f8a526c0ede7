"""Schedules: how many tokens a fixed-count policy commits at step i of a block. (Dream's
timestep schedule is part of its reference mode, in unmask.compat.)"""

from typing import Protocol

import torch


class Schedule(Protocol):
    def start_block(self, masked: torch.Tensor) -> None:
        """masked (B,): masked positions per row at the start of the block."""

    def quota(self, step: int, remaining: torch.Tensor) -> torch.Tensor:
        """(B,) tokens to commit at `step` given `remaining` (B,) masked candidates."""

    def select_rows(self, keep: torch.Tensor) -> None:
        """Drop finished rows: keep (B_new,) indices into the current rows."""


def even_split(n: torch.Tensor, steps: torch.Tensor, width: int) -> torch.Tensor:
    """LLaDA's even schedule, per row: n[b] tokens over steps[b] steps, n // steps each and the
    remainder one more on the first steps; (B, width) with zeros past a row's steps."""
    cols = torch.arange(width, device=n.device)[None, :]
    steps = steps[:, None]
    return torch.where(cols < steps, n[:, None] // steps + (cols < (n[:, None] % steps)).long(), 0)


class EvenSchedule:
    """LLaDA's schedule: n masks over `steps` steps, floor(n/steps) each, the remainder first."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.table: torch.Tensor | None = None

    def start_block(self, masked: torch.Tensor) -> None:
        self.table = even_split(masked, torch.full_like(masked, self.steps), self.steps)

    def quota(self, step: int, remaining: torch.Tensor) -> torch.Tensor:
        if step >= self.steps:  # only reachable when a quota could not be met: finish the block
            return remaining
        return self.table[:, step]

    def select_rows(self, keep: torch.Tensor) -> None:
        if self.table is not None:
            self.table = self.table[keep]
