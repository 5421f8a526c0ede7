"""The engine's random draws, for every row kind: a request with a seed draws from its own
generator, alone and in its own shape, so its output depends on no other request; the others
draw together, in one batched call, from torch's global generator."""

from collections.abc import Callable

import torch


class Draws:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.generators: dict[str, torch.Generator] = {}  # request id -> its own generator (a seed)

    def seed(self, request_id: str, seed: int) -> None:
        self.generators[request_id] = torch.Generator(self.device).manual_seed(seed)

    def forget(self, request_id: str) -> None:
        self.generators.pop(request_id, None)

    def get(self, request_id: str) -> torch.Generator | None:
        return self.generators.get(request_id)

    def seeded(self, reqs: list, rows: torch.Tensor | None = None) -> list[tuple[int, torch.Generator]]:
        """(position in `rows`, generator) for the rows `rows` (indices into `reqs`; None: all) whose
        request has a seed; no host work when no running request has one."""
        if not self.generators:
            return []
        ids = range(len(reqs)) if rows is None else rows.tolist()
        out = []
        for k, i in enumerate(ids):
            g = self.generators.get(reqs[i].id)
            if g is not None:
                out.append((k, g))
        return out

    def draw(self, count: int, seeded: list[tuple[int, torch.Generator]],
             batched: Callable[[torch.Tensor | None], torch.Tensor],
             alone: Callable[[int, torch.Generator], torch.Tensor]) -> torch.Tensor:
        """A (count, ...) draw: `batched(sel)` for the unseeded rows together (sel: their positions,
        or None for all `count` rows) and `alone(k, generator)` (shaped as one row of the result) for
        each seeded row."""
        if not seeded:
            return batched(None)
        own = {k for k, _ in seeded}
        shared = [k for k in range(count) if k not in own]
        out = None
        if shared:
            sel = torch.tensor(shared, dtype=torch.long, device=self.device)
            part = batched(sel)
            out = part.new_empty((count, *part.shape[1:]))
            out[sel] = part
        for k, g in seeded:
            one = alone(k, g)
            if out is None:
                out = one.new_empty((count, *one.shape))
            out[k] = one.to(out.device)
        return out
