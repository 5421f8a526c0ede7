"""Cache policies (one class per file, each registered in CACHES) and the KV storage they plan
for. Importing the package registers every policy."""

from unmask.cache import adaptive, causal, dllm, dual, exact, exact_dual, none, prefix  # noqa: F401
from unmask.cache.base import CACHES, CachePolicy, Plan, make_cache_policy, register

__all__ = ["CACHES", "CachePolicy", "Plan", "make_cache_policy", "register"]
