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
