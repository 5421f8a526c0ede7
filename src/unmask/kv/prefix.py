"""Prompt K/V shared across requests (automatic prefix caching, as vLLM's and SGLang's).

A prompt is cut into pages of `page` tokens. A page's key is a hash of its parent's key and its
own tokens (a hash chain over token blocks, as vLLM's block hashes), so a key names the whole
prefix up to the page's end; a lookup walks a prompt's pages from the first while their keys are
known. Each entry also keeps its tokens and parent key, and a lookup compares them: a hash
collision is a miss, never a wrong reuse.

The K/V live in a pool of page slots per cached tensor (a row kind's K/V fields: the masked
rows' "k", "v"; a speculative row's drafter context "dk", "dv" too; a renoising row's encoder
"k", "v", each layer its own shape), per layer (slots, H, page, D), grown as pages are added up
to the byte budget the engine sets (EngineConfig.prefix_cache_mb). (What is found and what is
evicted depend on the pages' tokens and their order of use, not on the hash values, so
tensor-parallel ranks, each with its own pool of its heads, agree.)
A running row keeps its K/V in its own slot of the rows' store (engine/rows.py), so a hit copies
the prefix's pages into the joining row's columns [0, m), and a row whose prompt K/V are final
(after its first step; a speculative row's after its first draft round, a renoising row's after
its prompt's encoder pass) copies its new pages in. Copies happen inside the step, so no page is
in use between steps: there is nothing to reference-count, and any page may be evicted.
Eviction is least recently used, leaves first: a lookup or insert touches a chain's pages from
its last to its first, so a page is always more recent than the pages that extend it, and a
prefix is never evicted while a longer one built on it stays.

Whose K/V may be reused is the cache policy's to say (unmask.cache CachePolicy.prefix): K/V
that depend on nothing after their position (a block-diffusion model's finished attention
blocks, a causal model's keys). A full-attention model's prompt K/V depend on the canvas after
them, so its rows never reuse (docs/serving.md)."""

from collections import OrderedDict
from dataclasses import dataclass

import torch

from unmask.kv.slots import SlotStore


@dataclass
class PrefixStats:
    queries: int = 0  # prompt tokens looked up (up to each prompt's reusable length)
    hits: int = 0  # of those, tokens whose K/V were reused
    lookups: int = 0  # prompts looked up
    hit_requests: int = 0  # of those, prompts that reused at least one page
    inserted: int = 0  # pages written
    evicted: int = 0  # pages dropped for room

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class PrefixStore:
    def __init__(self, budget_bytes: int, page: int) -> None:
        self.budget, self.page = budget_bytes, page
        # key -> (slot, parent key, the page's tokens); oldest first (the LRU order)
        self.table: OrderedDict[int, tuple[int, int | None, tuple]] = OrderedDict()
        self.free: list[int] = []
        self.slots = SlotStore()  # the page pool: name -> per layer (slots, H, page, D)
        self.capacity: int | None = None  # slots the budget holds (known once the first page is written)
        self.stats = PrefixStats()
        # request id -> (its reusable prompt length, the length it reused), from its lookup until
        # its prompt's K/V are final (then its pages join) or it leaves
        self.waiting: dict[int, tuple[int, int]] = {}

    @property
    def pages(self) -> int:
        return len(self.table)

    @property
    def pools(self) -> dict[str, list[torch.Tensor]]:
        """name -> per layer (slots, H, page, D)."""
        return {name: list(group.values()) for name, group in self.slots.groups.items()}

    @property
    def bytes(self) -> int:
        """Bytes the pool holds now (its slots, used or free)."""
        return self.slots.bytes

    # --- a row's lifecycle, the same for every row kind -------------------------------------------
    def lookup(self, req, limit: int) -> tuple[int, list[int]]:
        """A joining request's prompt, reusable up to `limit` tokens (the kind's and its cache
        policy's rule): the length found and its pages (0, [] under one page). The request is
        remembered until `final` (its prompt's K/V are final: its pages can join) or `forget`."""
        if limit < self.page:
            return 0, []
        m, slots = self.match(req.prompt, limit)
        self.waiting[req.id] = (limit, m)
        if m:
            req.cached_tokens = m
        return m, slots

    def final(self, req) -> tuple[int, int] | None:
        """The request's prompt K/V are final now: (reusable length, reused length) if it was
        looked up and not yet shared, else None (it is then forgotten)."""
        return self.waiting.pop(req.id, None)

    def share(self, req, fields: dict[str, list[torch.Tensor]], row: int) -> None:
        """The request's prompt K/V are final in row `row` of `fields` (columns from 0): its new
        pages join."""
        entry = self.final(req)
        if entry is not None:
            self.insert(req.prompt, entry[0], fields, row)

    def forget(self, reqs: list) -> None:
        """Requests leaving before their prompt's K/V were final."""
        for req in reqs:
            self.waiting.pop(req.id, None)

    def _chain(self, tokens: list[int], pages: int):
        parent = None
        for i in range(pages):
            page = tuple(tokens[i * self.page : (i + 1) * self.page])
            key = hash((parent, page))
            yield key, parent, page
            parent = key

    def _touch(self, keys: list[int]) -> None:
        for key in reversed(keys):  # the first page last: most recent (evicted after what extends it)
            self.table.move_to_end(key)

    def match(self, tokens: list[int], limit: int) -> tuple[int, list[int]]:
        """The longest cached prefix of `tokens` within `limit` tokens: (its length, its slots)."""
        pages = limit // self.page
        self.stats.lookups += 1
        self.stats.queries += pages * self.page
        keys, slots = [], []
        for key, parent, page in self._chain(tokens, pages):
            entry = self.table.get(key)
            if entry is None or entry[1] != parent or entry[2] != page:
                break
            keys.append(key)
            slots.append(entry[0])
        if keys:
            self._touch(keys)
            self.stats.hits += len(keys) * self.page
            self.stats.hit_requests += 1
        return len(keys) * self.page, slots

    def gather(self, slots: list[int]) -> dict[str, list[torch.Tensor]]:
        """Pages `slots` joined: name -> per layer (H, len(slots) * page, D)."""
        idx = torch.tensor(slots, dtype=torch.long, device=next(iter(self.pools.values()))[0].device)
        out = {}
        for name, pool in self.pools.items():
            got = [u[idx] for u in pool]  # (k, H, page, D)
            out[name] = [g.transpose(0, 1).reshape(g.shape[1], -1, g.shape[3]) for g in got]
        return out

    def load(self, fields: dict[str, list[torch.Tensor]], row: int, slots: list[int]) -> None:
        """Copy pages `slots` into row `row`'s columns [0, len(slots) * page) of `fields` (name ->
        per layer (n, H, C, D))."""
        if not slots:
            return
        m = len(slots) * self.page
        for name, pages in self.gather(slots).items():
            for u, got in zip(fields[name], pages):
                u[row, :, :m] = got

    def insert(self, tokens: list[int], limit: int, fields: dict[str, list[torch.Tensor]], row: int,
               offset: int = 0) -> None:
        """Add the pages of `tokens` within `limit` tokens that are not cached yet, from row
        `row`'s columns of `fields` (name -> per layer (n, H, C, D), its K/V, final there; column
        c holds token offset + c, `offset` a whole number of pages, so pages before it can only be
        found, not written): one copy per layer and field."""
        chain = list(self._chain(tokens, limit // self.page))
        if not chain:
            return
        if not self.pools:
            self._allocate(fields)
        if not self.capacity:
            return
        mine = {key for key, _, _ in chain}
        keys, new, slots = [], [], []
        for i, (key, parent, page) in enumerate(chain):
            entry = self.table.get(key)
            if entry is not None and entry[1] == parent and entry[2] == page:
                keys.append(key)
                continue
            if entry is not None or i * self.page < offset:  # a hash collision, or K/V not at hand
                break
            slot = self._slot(mine, len(chain) - i)
            if slot is None:
                break
            self.table[key] = (slot, parent, page)
            keys.append(key)
            new.append(i)
            slots.append(slot)
        if new:
            dev = next(iter(self.pools.values()))[0].device
            rel = [i - offset // self.page for i in new]  # the pages' places in `fields` (offset: whole pages)
            pages, to = (torch.tensor(v, dtype=torch.long, device=dev) for v in (rel, slots))
            span = (rel[-1] + 1) * self.page
            for name, layers in fields.items():
                for u, pool in zip(layers, self.pools[name]):
                    H, D = u.shape[1], u.shape[3]
                    pool[to] = u[row, :, :span].reshape(H, -1, self.page, D)[:, pages].transpose(0, 1)
            self.stats.inserted += len(new)
        self._touch(keys)

    def _allocate(self, fields: dict[str, list[torch.Tensor]]) -> None:
        """The pool's shape from the first row's K/V fields; no slots yet (they grow)."""
        per_slot = sum(u.shape[1] * self.page * u.shape[3] * u.element_size() for layers in fields.values()
                       for u in layers)
        self.capacity = self.budget // per_slot
        for name, layers in fields.items():
            self.slots.group(name, {i: u.new_zeros(0, u.shape[1], self.page, u.shape[3]) for i, u in enumerate(layers)})

    def _slot(self, keep: set, want: int = 1) -> int | None:
        """A free slot: an unused one, a new one (the pool grows by half, or by the `want` pages
        the chain being written still needs, within the budget), or the least recently used
        page's (never one of `keep`, the chain being written)."""
        if self.free:
            return self.free.pop()
        have = self.slots.slots
        if have < self.capacity:
            grow = min(max(have // 2, 16, want), self.capacity - have)
            self.slots.reserve(have + grow, exact=True)
            self.free = list(range(have + grow - 1, have, -1))
            return have
        if not self.table:
            return None
        key = next(iter(self.table))
        if key in keep:
            return None
        slot, _, _ = self.table.pop(key)
        self.stats.evicted += 1
        return slot

    def clear(self) -> None:
        self.table.clear()
        self.free.clear()
        self.slots.clear()
        self.waiting.clear()
        self.capacity = None
