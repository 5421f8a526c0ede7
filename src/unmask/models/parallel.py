"""Split a model over the ranks of a tensor-parallel group, before its weights are read.

Each family names its parameters in a plan (`tp_plan` on the model class: a regular expression
over module names -> a style), as Hugging Face's `base_model_tp_plan` does:

- "col": a projection whose output features split over the ranks (query heads, MLP gate and up
  columns); no communication;
- "kv": a key or value projection: split by key/value heads, or, with fewer key/value heads than
  ranks, each rank holds the one its query heads share (replicated, as vLLM does);
- "row": a projection whose input features split (attention output, MLP down); each rank's
  partial sum is all-reduced; a bias is added once (rank 0 holds it, the others zeros);
- "qkv": a fused query/key/value projection (LLaDA2.x): each of the three parts splits by heads;
- "experts": stacked experts split by expert (expert parallel); each rank runs its experts for
  every token and the all-reduce combines them (the dispatch is local: every rank holds every
  token under tensor parallelism);
- "vocab": the token embedding splits by vocabulary rows (VocabParallelEmbedding);
- "head": the output head splits by vocabulary rows; each rank computes its logits slice.

`shard_model` rewrites the meta-device module to its local shapes and returns, per checkpoint
key, which slice of the stored tensor this rank reads (the loader reads only that slice).
Norms, routers and rotary tables are replicated.
"""

import re

import torch
from torch import nn

from unmask.errors import UnmaskError
from unmask.layers.parallel import TensorParallel, VocabParallelEmbedding, reduce_output, split_range

ZERO = "zero"  # this rank holds zeros (a row-parallel bias lives on rank 0 only)


def check_divisible(config, world: int) -> None:
    """Whole heads on every rank, or an UnmaskError naming what does not divide. Key/value heads
    split over the ranks or, when fewer than the ranks, are replicated (N a multiple of them)."""
    c = config
    if c.num_heads % world:
        raise UnmaskError(f"tensor_parallel {world} does not divide the model's {c.num_heads} attention heads; "
                          f"choose a divisor of {c.num_heads}", param="tensor_parallel")
    counts = {"key/value heads": c.num_kv_heads}
    layout = c.layout
    if layout is not None and hasattr(layout, "full_kv_heads"):
        counts["full-attention key/value heads"] = layout.full_kv_heads
    for what, n in counts.items():
        if n % world and world % n:
            raise UnmaskError(f"tensor_parallel {world} neither divides nor is a multiple of the model's {n} {what}",
                              param="tensor_parallel")
    if c.moe is not None and c.moe.num_experts < world:
        raise UnmaskError(f"tensor_parallel {world} exceeds the model's {c.moe.num_experts} experts",
                          param="tensor_parallel")


def shard_model(model: nn.Module, tp: TensorParallel) -> dict[str, object]:
    """Rewrite `model` (on the meta device) to this rank's shard; returns checkpoint key -> a list
    of (dim, start, stop) ranges to read and concatenate, or ZERO. Keys not listed are read whole."""
    check_divisible(model.config, tp.world)
    plan = [(re.compile(p), style) for p, style in type(model).tp_plan.items()]
    specs: dict[str, object] = {}
    modules = dict(model.named_modules())
    for name, module in modules.items():
        style = next((s for p, s in plan if p.fullmatch(name)), None)
        if style is None:
            continue
        if style in ("col", "head"):
            specs.update(_split_linear(name, module, tp, dim=0))
        elif style == "kv":
            parent = modules[name.rpartition(".")[0]]
            kv = getattr(parent, "kv_heads", None) or model.config.num_kv_heads
            specs.update(_split_kv(name, module, kv, tp))
        elif style == "row":
            specs.update(_split_linear(name, module, tp, dim=1))
            module.register_forward_hook(reduce_output(tp))
        elif style == "qkv":
            specs.update(_split_qkv(name, module, model.config, tp))
        elif style == "experts":
            specs.update(_split_experts(name, module, tp))
            module.register_forward_hook(reduce_output(tp))
        elif style == "vocab":
            parent, _, leaf = name.rpartition(".")
            lo, hi = tp.vocab_range(module.num_embeddings)
            setattr(modules[parent] if parent else model, leaf,
                    VocabParallelEmbedding(hi - lo, module.embedding_dim, lo, tp, device="meta"))
            specs[f"{name}.weight"] = [(0, lo, hi)]
        else:
            raise ValueError(f"unknown tensor-parallel style {style!r} for {name}")
    for module in model.modules():  # attention modules keep their head counts in `heads`
        heads = getattr(module, "heads", None)
        if isinstance(heads, tuple):  # (query heads, key/value heads)
            module.heads = (heads[0] // tp.world, max(heads[1] // tp.world, 1))
        elif isinstance(heads, int):
            module.heads, module.kv_heads = heads // tp.world, max(module.kv_heads // tp.world, 1)
    model.tp = tp
    return specs


def _meta(shape) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, device="meta"), requires_grad=False)


def _split_linear(name: str, m: nn.Linear, tp: TensorParallel, dim: int) -> dict:
    n = m.weight.shape[dim]
    lo, hi = split_range(n, tp.world, tp.rank)
    shape = list(m.weight.shape)
    shape[dim] = hi - lo
    m.weight = _meta(shape)
    specs = {f"{name}.weight": [(dim, lo, hi)]}
    if dim == 0:
        m.out_features = hi - lo
        if m.bias is not None:
            m.bias = _meta((hi - lo,))
            specs[f"{name}.bias"] = [(0, lo, hi)]
    else:
        m.in_features = hi - lo
        if m.bias is not None and tp.rank:
            specs[f"{name}.bias"] = ZERO
    return specs


def kv_range(kv: int, tp: TensorParallel) -> tuple[int, int]:
    """The key/value heads rank tp.rank holds: its share, or (fewer heads than ranks) the one head
    its query heads share."""
    if kv >= tp.world:
        return split_range(kv, tp.world, tp.rank)
    h = tp.rank // (tp.world // kv)
    return h, h + 1


def _split_kv(name: str, m: nn.Linear, kv: int, tp: TensorParallel) -> dict:
    hd = m.weight.shape[0] // kv
    lo, hi = kv_range(kv, tp)
    m.weight = _meta(((hi - lo) * hd, m.weight.shape[1]))
    m.out_features = (hi - lo) * hd
    specs = {f"{name}.weight": [(0, lo * hd, hi * hd)]}
    if m.bias is not None:
        m.bias = _meta(((hi - lo) * hd,))
        specs[f"{name}.bias"] = [(0, lo * hd, hi * hd)]
    return specs


def _split_qkv(name: str, m: nn.Linear, c, tp: TensorParallel) -> dict:
    hd, ranges, at = c.head_dim, [], 0
    for heads, share in ((c.num_heads, split_range(c.num_heads, tp.world, tp.rank)),
                         (c.num_kv_heads, kv_range(c.num_kv_heads, tp)), (c.num_kv_heads, kv_range(c.num_kv_heads, tp))):
        lo, hi = share
        ranges.append((0, at + lo * hd, at + hi * hd))
        at += heads * hd
    rows = sum(b - a for _, a, b in ranges)
    m.weight = _meta((rows, m.weight.shape[1]))
    m.out_features = rows
    specs = {f"{name}.weight": ranges}
    if m.bias is not None:
        m.bias = _meta((rows,))
        specs[f"{name}.bias"] = ranges
    return specs


def _split_experts(name: str, m: nn.Module, tp: TensorParallel) -> dict:
    """Stacked experts: unmask.layers.moe.Experts (per-expert checkpoint keys; those of other
    ranks are not read) or a packed pair of (E, ...) parameters (DiffusionGemma)."""
    if hasattr(m, "w_in"):
        lo, hi = split_range(m.num, tp.world, tp.rank)
        m.w_in = _meta((hi - lo, *m.w_in.shape[1:]))
        m.w_out = _meta((hi - lo, *m.w_out.shape[1:]))
        m.num, m.first = hi - lo, lo
        return {}
    specs = {}
    for pname, p in list(m.named_parameters(recurse=False)):
        lo, hi = split_range(p.shape[0], tp.world, tp.rank)
        setattr(m, pname, _meta((hi - lo, *p.shape[1:])))
        specs[f"{name}.{pname}"] = [(0, lo, hi)]
        m.first = lo
    return specs


def read_slice(sl, spec) -> torch.Tensor:
    """This rank's part of a checkpoint tensor (a safetensors slice) under `spec`."""
    parts = [sl[a:b] if dim == 0 else sl[:, a:b] for dim, a, b in spec]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=spec[0][0])
