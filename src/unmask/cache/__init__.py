"""KV storage and the cache policies that decide which positions each forward recomputes."""

from unmask.cache.kv import StaticKV
from unmask.cache.policy import CACHES, CachePolicy, DualCache, ForwardPlan, NoCache, PrefixCache, make_cache_policy

__all__ = ["StaticKV", "CACHES", "CachePolicy", "DualCache", "ForwardPlan", "NoCache", "PrefixCache",
           "make_cache_policy"]
