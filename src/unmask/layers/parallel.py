"""Tensor parallelism's arithmetic on torch.distributed: the process group a sharded model runs
in, the collectives its layers need, and the vocabulary-parallel embedding.

A model split over N ranks (unmask.models.parallel) holds on each rank: a slice of every
attention head group and MLP column block (column-parallel projections, no communication), the
matching rows of the output projections (row-parallel: partial sums, one all-reduce), a slice of
the experts (expert parallel: each rank runs its own experts for every token, one all-reduce
combines them) and a slice of the vocabulary (embedding rows; head rows, so each rank holds the
logits of its vocabulary slice). Samplers reduce over the vocabulary slices without gathering the
logits (unmask.sampler.proposal); whoever needs whole logits gathers them here.

The same code runs with gloo on CPU and NCCL on GPUs: only the backend differs.
"""

import torch
import torch.distributed as dist
from torch import nn


def split_sizes(n: int, parts: int) -> list[int]:
    """How `n` items split over `parts` ranks: as torch.tensor_split does (the first n % parts get one more)."""
    base, extra = divmod(n, parts)
    return [base + (i < extra) for i in range(parts)]


def split_range(n: int, parts: int, rank: int) -> tuple[int, int]:
    """[start, stop) of rank `rank`'s share of `n` items."""
    sizes = split_sizes(n, parts)
    start = sum(sizes[:rank])
    return start, start + sizes[rank]


class TensorParallel:
    """One rank's view of a tensor-parallel group: its rank, the world size, the group, and the
    collectives a sharded model and its sampler call. Every collective is called by every rank in
    the same order (the ranks step in lockstep)."""

    def __init__(self, rank: int, world: int, group=None) -> None:
        self.rank, self.world, self.group = rank, world, group

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of x over the ranks (in place, and returned)."""
        dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """(world, *x.shape): every rank's x, in rank order. x has the same shape on every rank."""
        out = x.new_empty((self.world * x.shape[0], *x.shape[1:]))  # concatenated along dim 0
        dist.all_gather_single(out, x.contiguous(), group=self.group)
        return out.view(self.world, *x.shape)

    def vocab_range(self, vocab: int) -> tuple[int, int]:
        return split_range(vocab, self.world, self.rank)

    def gather_vocab(self, local: torch.Tensor, vocab: int) -> torch.Tensor:
        """Whole logits (..., V) from each rank's (..., V_rank) slice: shards are padded to the
        largest, gathered, and cut back."""
        width = split_sizes(vocab, self.world)[0]
        pad = width - local.shape[-1]
        if pad:
            local = torch.nn.functional.pad(local, (0, pad))
        parts = self.all_gather(local)  # (world, ..., width)
        sizes = split_sizes(vocab, self.world)
        return torch.cat([parts[r][..., : sizes[r]] for r in range(self.world)], dim=-1)


class VocabParallelEmbedding(nn.Embedding):
    """An embedding holding rows [start, start + num_embeddings) of the vocabulary: ids outside
    the slice look up zeros here, and the all-reduce adds the rank that holds them."""

    def __init__(self, rows: int, dim: int, start: int, tp: TensorParallel, **kw) -> None:
        super().__init__(rows, dim, **kw)
        self.start, self.tp = start, tp

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        inside = (local >= 0) & (local < self.num_embeddings)
        out = super().forward(torch.where(inside, local, 0))
        out = out * inside[..., None].to(out.dtype)
        return self.tp.all_reduce(out)


def reduce_output(tp: TensorParallel):
    """A forward hook that all-reduces a module's output (row-parallel projections, expert slices)."""

    def hook(module, args, output):
        return tp.all_reduce(output)

    return hook
