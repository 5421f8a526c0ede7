"""Fast-dLLM's DualCache: the committed prefix and the masked suffix are cached; only the block
is recomputed."""

from dataclasses import dataclass
from typing import ClassVar

from unmask.cache.base import register
from unmask.cache.prefix import PrefixCache


@register
@dataclass(frozen=True)
class DualCache(PrefixCache):
    """PrefixCache's refreshes; other steps recompute the open block [s, e) only, against cached
    K/V of everything else."""

    name: ClassVar[str] = "dual"

    def window_end(self, rows):
        return rows.e
