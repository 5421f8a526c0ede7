"""Fast-dLLM v2's use_block_cache: exact K/V of finished blocks, and DualCache inside the open
block over its sub-blocks."""

from dataclasses import dataclass
from typing import ClassVar

from unmask.cache.base import register
from unmask.cache.exact import ExactCache


@register
@dataclass(frozen=True)
class ExactDualCache(ExactCache):
    """A sub-block's first step computes the whole block; its later steps compute only the
    sub-block, against the block's K/V from that first step (approximate, as DualCache is)."""

    name: ClassVar[str] = "exact-dual"
    sub_block_cache: ClassVar[bool] = True
