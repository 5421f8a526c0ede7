"""Cache policies decide, for step `i` of a block [s, e) on a canvas of length L, which columns
the next forward recomputes and whether it refreshes the cache.

- none:   every forward recomputes the whole canvas; nothing is stored.
- prefix: a refresh (full forward that also proposes and commits) at the block start and every
          `refresh_interval` steps; other steps recompute [s, L) against cached K/V of [0, s).
- dual:   like prefix, but other steps recompute only [s, e); the masked suffix is cached too.
The refresh interval counts steps inside a block and is independent of the block length.
Models whose logits are shifted (Dream) need the hidden state of column s - 1 to score column
s, so their windows start `shift` columns earlier.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class ForwardPlan:
    start: int  # first recomputed canvas column
    end: int  # one past the last recomputed column
    use_kv: bool  # read/write the KV buffer (False: plain full forward)
    refresh: bool  # the whole canvas is recomputed (exact logits)


@dataclass(frozen=True)
class CachePolicy:
    name: str
    refresh_interval: int | None = None

    @property
    def stores_kv(self) -> bool:
        return self.name != "none"

    def plan(self, step: int, s: int, e: int, length: int, shift: int = 0) -> ForwardPlan:
        if self.name == "none":
            return ForwardPlan(0, length, False, True)
        if step == 0 or (self.refresh_interval is not None and step % self.refresh_interval == 0):
            return ForwardPlan(0, length, True, True)
        end = length if self.name == "prefix" else e
        return ForwardPlan(s - shift, end, True, False)


CACHES = ("none", "prefix", "dual")


def make_cache_policy(name: str, refresh_interval: int | None = None) -> CachePolicy:
    if name not in CACHES:
        raise ValueError(f"unknown cache {name!r}; choose one of {', '.join(CACHES)}")
    return CachePolicy(name, refresh_interval)
