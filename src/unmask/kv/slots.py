"""The one slot store of K/V memory: tensors whose first dimension is a slot, grouped by name.

Every per-row cache of the engine keeps its tensors here — the masked and speculative rows' K/V
and drafter context (engine/rows.py `Rows`), the renoising encoder's held slots (kv/renoise.py
`RenoiseKV`) — and so does the prefix cache's page pool (kv/prefix.py). What they share is the
memory's lifecycle, written once:

- the first `n` slots are in use; `add(k)` takes the next k, zeroed (the store grows by half when
  full, so joins copy nothing in the steady state);
- `keep(perm)`: only these slots stay, slot i being old slot perm[i]; only the slots a departure
  displaces are copied (the last rows move into freed ones), never the whole store; the last one
  leaving frees the memory;
- `widen(name, dim, size)`: a longer canvas (or more held slots) widens one group's columns;
- `view(name)`: the slots in use, as views (no copy).

A group is a dict key -> tensor (a layer's K, a layer kind's positions) or None while not yet
allocated; tensors of a group may differ in every dimension but the first."""

import torch


class SlotStore:
    def __init__(self, n: int = 0) -> None:
        self.n = n  # slots in use: the first n of every tensor
        self.groups: dict[str, dict] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.groups

    def _tensors(self):
        return [t for group in self.groups.values() for t in group.values() if t is not None]

    @property
    def slots(self) -> int:
        """Slots allocated (at least `n` in every tensor)."""
        return min((t.shape[0] for t in self._tensors()), default=self.n)

    @property
    def bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._tensors())

    def group(self, name: str, tensors: dict | None = None) -> dict:
        """Group `name` (created from `tensors`, each with at least `n` slots, if it is not here)."""
        if name not in self.groups:
            self.groups[name] = dict(tensors or {})
        return self.groups[name]

    def view(self, name: str) -> dict:
        """The slots in use of each tensor of `name` (views)."""
        return {key: None if t is None else t[: self.n] for key, t in self.groups[name].items()}

    @torch.no_grad()
    def reserve(self, slots: int, exact: bool = False) -> None:
        """At least `slots` slots in every tensor: a store half as large again (or exactly `slots`)."""
        for group in self.groups.values():
            for key, t in group.items():
                if t is not None and t.shape[0] < slots:
                    size = slots if exact else max(slots, t.shape[0] * 3 // 2)
                    group[key] = torch.cat([t, t.new_zeros(size - t.shape[0], *t.shape[1:])])

    @torch.no_grad()
    def add(self, k: int) -> None:
        """k slots join at the end, zeroed."""
        self.reserve(self.n + k)
        for t in self._tensors():
            t[self.n : self.n + k].zero_()
        self.n += k

    @torch.no_grad()
    def keep(self, perm) -> None:
        """Only these slots stay, slot i being old slot perm[i] (a list or a long tensor); only
        the slots that move are copied. The last one leaving frees every group."""
        perm = torch.as_tensor(perm, dtype=torch.long)
        self.n = perm.numel()
        if self.n == 0:
            self.groups.clear()
            return
        dst = (perm != torch.arange(self.n, device=perm.device)).nonzero().squeeze(-1)
        if dst.numel():
            src = perm[dst]
            for t in self._tensors():
                index = (dst.to(t.device), src.to(t.device))
                t[index[0]] = t[index[1]]

    @torch.no_grad()
    def widen(self, name: str, dim: int, size: int, keep: int | None = None, fill=0, keys=None) -> None:
        """Tensors of group `name` (those of `keys`, default all) to `size` along `dim` where they
        are narrower: their first `keep` entries along it kept (default all), the rest `fill`."""
        group = self.groups[name]
        for key in group if keys is None else keys:
            t = group[key]
            if t is None or t.shape[dim] >= size:
                continue
            shape = list(t.shape)
            shape[dim] = size
            out = t.new_full(shape, fill)
            kept = t.shape[dim] if keep is None else keep
            out.narrow(dim, 0, kept).copy_(t.narrow(dim, 0, kept))
            group[key] = out

    def clear(self) -> None:
        self.groups.clear()
