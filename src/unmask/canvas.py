"""The reference samplers' canvas: prompts left-padded to a common length, so that block
boundaries are the same columns in every row (LLaDA's and Dream's samplers and their evals pad
that way). The reference loops decode on it, and training builds
its batches in the same layout (unmask.train.data). The request engine does not: each of its
rows has its own right-padded canvas (unmask.engine.rows)."""

from dataclasses import dataclass

import torch

from unmask.sampler.stops import first_stop


def left_padded(prompts: list[list[int]], tail: int, pad_id: int, fill_id: int):
    """Each prompt left-padded with `pad_id` to the longest prompt length P, then `tail` columns
    of `fill_id` (MASK when decoding; the answer and end-of-text padding when training).
    Returns x (B, P + tail) ids, positions (B, P + tail) counted from each row's first real
    token (0 on padding), and key_mask (B, P + tail), True = real token, or None when no row
    is padded."""
    lengths = torch.tensor([len(p) for p in prompts])
    P = int(lengths.max())
    x = torch.full((len(prompts), P + tail), fill_id, dtype=torch.long)
    x[:, :P] = pad_id
    for r, p in enumerate(prompts):  # host-side setup, once per batch
        x[r, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
    pad = (P - lengths)[:, None]
    cols = torch.arange(P + tail)[None, :]
    positions = (cols - pad).clamp(min=0)
    key_mask = (cols >= pad) if bool((pad > 0).any()) else None
    return x, positions, key_mask


@dataclass
class Canvas:
    """Prompts are left-padded to a common length P so that block boundaries are the same
    columns in every row; padding is masked out of attention and positions count from each
    row's first real token (`left_padded`). Finished rows leave the batch through `select_rows`."""

    x: torch.Tensor  # (B, L) token ids: [pad.. prompt | gen_length masks | suffix ..pad]
    positions: torch.Tensor  # (B, L) RoPE positions
    key_mask: torch.Tensor | None  # (B, L) True = real token; None when no row is padded
    rows: torch.Tensor  # (B,) index of each row in the original batch
    prompt_len: int  # P, columns before the generation region
    region_end: int  # P + gen_length: the columns after it hold the suffix (infilling)

    @classmethod
    def build(
        cls, prompts: list[list[int]], gen_length: int, mask_id: int, pad_id: int, device: torch.device,
        suffixes: list[list[int]] | None = None,
    ) -> "Canvas":
        """`suffixes`: fixed text after each row's hole (infilling), right-padded to the longest
        and masked out of attention where padded; positions continue through it."""
        x, positions, key_mask = left_padded(prompts, gen_length, pad_id, mask_id)
        P = x.shape[1] - gen_length
        S = max((len(t) for t in suffixes), default=0) if suffixes else 0
        if S:
            lengths = torch.tensor([len(t) for t in suffixes])
            tail = torch.full((len(prompts), S), pad_id, dtype=torch.long)
            for r, t in enumerate(suffixes):  # host-side setup, once per batch
                tail[r, : len(t)] = torch.tensor(t, dtype=torch.long)
            x = torch.cat([x, tail], 1)
            positions = torch.cat([positions, positions[:, -1:] + 1 + torch.arange(S)[None, :]], 1)
            real = torch.arange(S)[None, :] < lengths[:, None]
            if key_mask is not None or not bool(real.all()):
                head = key_mask if key_mask is not None else torch.ones(len(prompts), P + gen_length, dtype=torch.bool)
                key_mask = torch.cat([head, real], 1)
        to = dict(device=device)
        return cls(
            x.to(**to),
            positions.to(**to),
            None if key_mask is None else key_mask.to(**to),
            torch.arange(len(prompts), device=device),
            P,
            P + gen_length,
        )

    @property
    def batch(self) -> int:
        return self.x.shape[0]

    @property
    def length(self) -> int:
        return self.x.shape[1]

    def select_rows(self, keep: torch.Tensor) -> None:
        self.x = self.x[keep]
        self.positions = self.positions[keep]
        self.rows = self.rows[keep]
        if self.key_mask is not None:
            self.key_mask = self.key_mask[keep]


def retire_rows(c: Canvas, out: torch.Tensor, done: torch.Tensor, *others) -> torch.Tensor:
    """Copy finished rows of the canvas to `out` (indexed by original row) and drop them from the
    canvas and from every other per-row state in `others` (KV buffer, schedule). Returns the
    kept row indices."""
    out[c.rows[done]] = c.x[done]
    keep = (~done).nonzero().squeeze(-1)
    for state in (c, *others):
        if state is not None:
            state.select_rows(keep)
    return keep


def finished_rows(gen: torch.Tensor, mask_id: int, stop_ids: torch.Tensor) -> torch.Tensor:
    """(B, G) generated region -> (B,) bool: the row has committed a stop token and every
    position before its first stop token is committed."""
    has_stop, first = first_stop(gen, stop_ids)
    cols = torch.arange(gen.shape[-1], device=gen.device)[None, :]
    masked_before = ((gen == mask_id) & (cols < first[:, None])).any(-1)
    return has_stop & ~masked_before
