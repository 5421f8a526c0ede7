"""Cache policies decide, for step `i` of a block [s, e) on a canvas of length L, which columns
the next forward recomputes and whether it refreshes the cache. One small class per mode;
`@register` adds it to CACHES, from which the CLI, the bench grid and the checks derive.

- none:   every forward recomputes the whole canvas; nothing is stored.
- prefix: a refresh (full forward that also proposes and commits) at the block start and every
          `refresh_interval` steps; other steps recompute [s, L) against cached K/V of [0, s).
- dual:   like prefix, but other steps recompute only [s, e); the masked suffix is cached too.
- adaptive: DualCache's windows, but a row refreshes when it has committed `refresh_tokens`
          tokens since its last full forward (the cached K/V were computed before those tokens
          existed; commit-time diagnostics show disagreement with a fresh forward grows with
          them), besides the block start (and every `refresh_interval` steps if given). Rows
          decide alone: a row that refreshes runs in the step's full forward while the others
          keep their cached window (the request engine runs it; see docs/decoding.md).
- exact:  block-diffusion models only (config bd_size): a finished block never sees a later one, so
          its K/V are final once computed with its final tokens. One prefill (prompt and first
          block), then each step the open block only; the step after a block completes also
          recomputes that block (the commit forward, fused with the next block's first step).
- exact-dual: exact for finished blocks, and inside the open block DualCache over its sub-blocks
          (block_length below bd_size; Fast-dLLM v2's use_block_cache): a sub-block's first step
          computes the whole block, later steps only the sub-block against the block's stale K/V.
The refresh interval counts steps inside a block and is independent of the block length.
Models whose logits are shifted (Dream) need the hidden state of column s - 1 to score column
s, so their windows start `shift` columns earlier.
"""

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from unmask.registry import Registry


@dataclass(frozen=True)
class ForwardPlan:
    start: int  # first recomputed canvas column
    end: int  # one past the last recomputed column
    use_kv: bool  # read/write the KV buffer (False: plain full forward)
    refresh: bool  # the whole canvas is recomputed (exact logits)


class CachePolicy(Protocol):
    name: str
    stores_kv: bool  # keeps a KV buffer between forwards

    def plan(self, step: int, s: int, e: int, length: int, shift: int = 0) -> ForwardPlan:
        ...


CACHES = Registry("cache")
register = CACHES.register


@register
@dataclass(frozen=True)
class NoCache:
    """Recompute the whole canvas every step (exact; the reference samplers' default)."""

    name: ClassVar[str] = "none"
    stores_kv: ClassVar[bool] = False
    refreshes: ClassVar[bool] = False  # has a refresh interval to tune

    @classmethod
    def from_params(cls, p: Any) -> "NoCache":
        return cls()

    def plan(self, step: int, s: int, e: int, length: int, shift: int = 0) -> ForwardPlan:
        return ForwardPlan(0, length, False, True)


@register
@dataclass(frozen=True)
class PrefixCache:
    """Fast-dLLM's PrefixCache: the committed prefix [0, s) is cached; [s, L) is recomputed."""

    name: ClassVar[str] = "prefix"
    stores_kv: ClassVar[bool] = True
    refreshes: ClassVar[bool] = True
    refresh_interval: int | None = None

    @classmethod
    def from_params(cls, p: Any):
        return cls(p.refresh_interval)

    def is_refresh(self, step: int) -> bool:
        return step == 0 or (self.refresh_interval is not None and step % self.refresh_interval == 0)

    def window_end(self, e: int, length: int) -> int:
        return length

    def plan(self, step: int, s: int, e: int, length: int, shift: int = 0) -> ForwardPlan:
        if self.is_refresh(step):
            return ForwardPlan(0, length, True, True)
        return ForwardPlan(s - shift, self.window_end(e, length), True, False)


@register
@dataclass(frozen=True)
class DualCache(PrefixCache):
    """Fast-dLLM's DualCache: prefix and masked suffix are cached; only the block is recomputed."""

    name: ClassVar[str] = "dual"

    def window_end(self, e: int, length: int) -> int:
        return e


@register
@dataclass(frozen=True)
class AdaptiveCache(DualCache):
    """DualCache whose rows refresh when a cheap signal says the cache matters:
    - refresh_tokens N: the row's next forward is a full one once it has committed N tokens since
      its last full forward (planned before the step);
    - refresh_below c: a cached step that would commit a token whose cached probability is below
      c commits nothing from it; the row recomputes the step with a full forward in the same
      engine step and commits from that (the window is wasted: two forwards, both counted).
    Either, both, or neither given (then DEFAULT_TRIGGER). What a triggered refresh recomputes
    (`refresh_scope`): "canvas", a full forward (with a trigger that fires every step the decode
    is exactly `none`'s), or "suffix", the block and the masked suffix against the prefix K/V of
    the block start (with a trigger that fires every step: exactly PrefixCache's decode). The
    block start and `refresh_interval` steps are full refreshes either way. The signals live in
    the request engine's rows, so only the engine runs this policy."""

    name: ClassVar[str] = "adaptive"
    adaptive: ClassVar[bool] = True
    SCOPES: ClassVar[tuple[str, ...]] = ("suffix", "canvas")
    DEFAULT_TRIGGER: ClassVar[dict] = {"refresh_below": 0.9}
    refresh_tokens: int | None = None
    refresh_below: float | None = None
    refresh_scope: str = "suffix"

    @classmethod
    def from_params(cls, p: Any) -> "AdaptiveCache":
        scope = p.refresh_scope or cls.refresh_scope
        if p.refresh_tokens is None and p.refresh_below is None:
            return cls(p.refresh_interval, refresh_scope=scope, **cls.DEFAULT_TRIGGER)
        return cls(p.refresh_interval, p.refresh_tokens, p.refresh_below, scope)

    def plan(self, step: int, s: int, e: int, length: int, shift: int = 0) -> ForwardPlan:
        raise NotImplementedError("the adaptive cache's refresh depends on what each row committed; the request "
                                  "engine plans it (unmask.engine.engine)")


def make_cache_policy(p: Any):
    """The cache policy that generation parameters `p` name (p.cache)."""
    return CACHES.lookup(p.cache).from_params(p)


@register
@dataclass(frozen=True)
class ExactCache:
    """A block-diffusion model's exact KV cache of finished blocks. Only the request engine runs it
    (it plans the prefill, open-block and commit forwards; see the module docstring); the lockstep
    compat loops, which call `plan`, never take it."""

    name: ClassVar[str] = "exact"
    stores_kv: ClassVar[bool] = True
    refreshes: ClassVar[bool] = False
    exact: ClassVar[bool] = True
    sub_block_cache: ClassVar[bool] = False  # also cache the open block between its sub-blocks

    @classmethod
    def from_params(cls, p: Any) -> "ExactCache":
        return cls()

    def window_end(self, e: int, length: int) -> int:
        return e


@register
@dataclass(frozen=True)
class ExactDualCache(ExactCache):
    """Exact K/V of finished blocks; inside the open block, the K/V of the sub-blocks not being
    decoded are reused from the sub-block's first step (approximate, as DualCache is)."""

    name: ClassVar[str] = "exact-dual"
    sub_block_cache: ClassVar[bool] = True
