"""What a cache policy decides, and the registry of them.

A cache policy answers, for every running row of the request engine and in tensors, what this
step recomputes (`plan`: a full forward over the row's columns [0, end), or a window
[start, end) against the row's cached K/V), whether a cached commit must be verified and what
then is recomputed (`verifies`, `doubts`, `recompute`), and keeps its own per-row counters up
to date after the step (`after`). The engine merges the plans of the settings that run, sizes
the forwards from them and never looks inside a policy. A new cache is one class in one file
of this package plus `@register`; it declares the generation parameters it reads in `fields`
(unmask.knobs), from which GenerationParams is built.

Models whose logits are shifted (Dream) need the hidden state of column s - 1 to score column
s, so windows start `shift` columns before the open block.
"""

from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch

from unmask.knobs import Knob, positive_int
from unmask.registry import Registry


@dataclass
class Plan:
    """One step's work for each running row, as (n,) tensors."""

    full: torch.Tensor  # bool: a full forward over columns [0, end) (no cache, a refresh, a prefill)
    start: torch.Tensor  # first recomputed column (0 for full rows)
    end: torch.Tensor  # one past the last recomputed column
    kv: torch.Tensor  # bool: the row keeps K/V (a full forward writes them, a window reads and writes them)
    seals: torch.Tensor  # bool: the window also rewrites a finished block's K/V (the seal forward)
    reset: torch.Tensor  # bool: after this step the row's K/V are as fresh as a refresh makes them

    @property
    def cost(self) -> torch.Tensor:
        """Positions computed per row: what the token budget counts."""
        return self.end - self.start

    def where(self, rows: torch.Tensor, other: "Plan") -> "Plan":
        """This plan, with `other`'s entries for `rows`."""
        return Plan(*(torch.where(rows, getattr(other, f.name), getattr(self, f.name)) for f in fields(Plan)))

    @classmethod
    def window(cls, rows, start: torch.Tensor, end: torch.Tensor, full: torch.Tensor | None = None,
               kv: bool = True) -> "Plan":
        """Window rows [start, end) (rows whose `full` is set: a full forward over the canvas,
        [0, rows.T), the fixed text after a hole included)."""
        no = torch.zeros_like(start, dtype=torch.bool)
        full = no if full is None else full
        return cls(full, torch.where(full, 0, start), torch.where(full, rows.T, end), no | kv, no, full.clone())


class CachePolicy:
    """The interface; see the module docstring. `rows` is the engine's RowState: per-row tensors
    s / e (the open block), L (the generated region's end), T (the canvas's end: L, or past the
    fixed text after a hole), P (prompt end), blk (block length), step (inside the
    block), block (index); and `rows.state[name]`, the (n,) long counters a policy declares in
    `row_state` (name -> its value when a row joins, from the row's prompt end P and the model's
    attention block `align`): the engine keeps them with the rows and knows nothing else of them."""

    name: ClassVar[str]
    stores_kv: ClassVar[bool] = True
    # the generation parameters it reads (others are refused), and their names
    fields: ClassVar[dict[str, Knob]] = {}
    knobs: ClassVar[tuple[str, ...]] = ()
    verifies: ClassVar[bool] = False  # `doubts` may ask to recompute a cached step
    # what the architecture must be: "full" (bidirectional over the canvas), "block" (bd_size),
    # "causal" (the AR twin); a policy suits the kinds it names
    suits: ClassVar[tuple[str, ...]] = ("full",)
    # per-row counters the policy owns: name -> initial value (P, align) -> int
    row_state: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, **kw) -> None:
        super().__init_subclass__(**kw)
        cls.knobs = tuple(cls.fields)

    @classmethod
    def from_params(cls, p: Any) -> "CachePolicy":
        return cls()

    def plan(self, rows, shift: int, align: int) -> Plan:
        raise NotImplementedError

    def prefix(self, P: int, align: int, shift: int) -> int:
        """How many of a prompt's P first tokens have K/V that depend on nothing after them, so
        that another request with the same tokens may reuse them (kv/prefix.py); the row's
        first plan then starts at `rows.reused` (the columns reused, 0 when none). 0: none (a
        full-attention model's prompt K/V depend on the canvas after it)."""
        return 0

    def doubts(self, prob: torch.Tensor, commit: torch.Tensor) -> torch.Tensor:
        """(B, W) probability of each proposed token, (B, W) what would commit -> (B,) rows whose
        cached step must be recomputed before anything commits. Only asked when `verifies`."""
        raise NotImplementedError

    def recompute(self, rows, shift: int) -> Plan:
        """What a doubted row recomputes in the same step."""
        raise NotImplementedError

    def after(self, rows, ran: torch.Tensor, plan: Plan, doubted: torch.Tensor, committed: torch.Tensor,
              align: int) -> None:
        """Update the policy's per-row counters for `ran`, the rows of its setting that ran."""


# read by every cache that refreshes on a schedule (one declaration, shared)
REFRESH_INTERVAL = Knob(None, int, "also refresh the cache every N steps inside a block", positive_int,
                        from_model=True)


def refresh_due(rows, interval: int | None) -> torch.Tensor:
    """A refresh at the block start and every `interval` steps inside the block."""
    fresh = rows.step == 0
    return fresh | (rows.step % interval == 0) if interval is not None else fresh


CACHES = Registry("cache")
register = CACHES.register


def make_cache_policy(p: Any) -> CachePolicy:
    """The cache policy that generation parameters `p` name (p.cache)."""
    return CACHES.lookup(p.cache).from_params(p)
