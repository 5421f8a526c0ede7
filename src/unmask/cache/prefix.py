"""Fast-dLLM's PrefixCache: the committed prefix [0, s) is cached; [s, L) is recomputed."""

from dataclasses import dataclass
from typing import Any, ClassVar

from unmask.cache.base import REFRESH_INTERVAL, CachePolicy, Plan, refresh_due, register


@register
@dataclass(frozen=True)
class PrefixCache(CachePolicy):
    """A refresh (a full forward that also proposes and commits) at the block start and every
    `refresh_interval` steps; other steps recompute the block and the masked suffix [s, L)
    against the cached K/V of [0, s)."""

    name: ClassVar[str] = "prefix"
    fields: ClassVar[dict] = {"refresh_interval": REFRESH_INTERVAL}
    refresh_interval: int | None = None

    @classmethod
    def from_params(cls, p: Any) -> "PrefixCache":
        return cls(p.refresh_interval)

    def window_end(self, rows):
        """Where a cached step's window ends: the canvas end, past any fixed text after the hole
        (DualCache: the block end)."""
        return rows.T

    def plan(self, rows, shift: int, align: int) -> Plan:
        return Plan.window(rows, rows.s - shift, self.window_end(rows), full=refresh_due(rows, self.refresh_interval))
