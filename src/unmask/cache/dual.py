"""Fast-dLLM's DualCache: the committed prefix and the masked suffix are cached; only the block
is recomputed."""

from dataclasses import dataclass
from typing import Any, ClassVar

from unmask.cache.base import CachePolicy, Plan, refresh_due, register


@register
@dataclass(frozen=True)
class DualCache(CachePolicy):
    """A refresh at the block start and every `refresh_interval` steps; other steps recompute the
    open block [s, e) only, against cached K/V of everything else."""

    name: ClassVar[str] = "dual"
    knobs: ClassVar[tuple[str, ...]] = ("refresh_interval",)
    refresh_interval: int | None = None

    @classmethod
    def from_params(cls, p: Any) -> "DualCache":
        return cls(p.refresh_interval)

    def plan(self, rows, shift: int, align: int) -> Plan:
        return Plan.window(rows, rows.s - shift, rows.e, full=refresh_due(rows, self.refresh_interval))
