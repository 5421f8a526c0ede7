"""Where a row's end of text is: the one stop-token search of the engine, the reference loops and
the results."""

import torch


def first_stop(ids: torch.Tensor, stop_ids: torch.Tensor, where: torch.Tensor | None = None,
               none: torch.Tensor | int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) ids -> ((B,) whether a stop id occurs among the columns `where` allows, (B,) the
    column of the first one, or `none` (default L) where there is none)."""
    is_stop = torch.isin(ids, stop_ids)
    if where is not None:
        is_stop = is_stop & where
    has = is_stop.any(-1)
    default = ids.shape[-1] if none is None else none
    return has, torch.where(has, is_stop.int().argmax(-1), default)


def first_stop_index(ids: list[int], stops) -> int | None:
    """The index of the first stop id in a host list, or None."""
    return next((j for j, t in enumerate(ids) if t in stops), None)


# a hole whose length the model decides ends where its text starts writing the text after it:
# that many of the suffix's first tokens (or the whole suffix, when shorter)
SUFFIX_OVERLAP = 2


def suffix_overlap(ids: list[int], suffix: list[int], need: int = SUFFIX_OVERLAP) -> tuple[int | None, int]:
    """A hole's middle against the text after it (infilling with the length bounded, not given): a
    model trained to end its answers with end-of-text padding, given more masks than the middle
    needs, writes the middle, then the suffix's own text, then ends. Returns (the index where
    `ids` first go on with the suffix's first `need` tokens — the middle ends there — or None;
    the index from which `ids` might still begin to (held back from a stream until it is known))."""
    need = min(need, len(suffix))
    if need == 0:
        return None, len(ids)
    held = len(ids)
    for m in range(1, len(ids) + 1):
        rest = ids[m : m + need]
        if len(rest) == need and rest == suffix[:need]:
            return m, m
        if len(rest) < need and rest == suffix[: len(rest)] and held == len(ids):
            held = m
    return None, held
