"""Mixture-of-experts feed-forward layer: a router picks `top_k` of `num_experts` SwiGLU experts
per token; the outputs are mixed by the router's weights (plus shared experts, which every token
takes).

Batched: the (token, slot) pairs are sorted by expert and each expert's contiguous group goes
through one grouped matrix multiply (torch.nn.functional.grouped_mm) for all experts at once;
there is no Python loop over tokens or experts. Expert weights are held stacked, (E, 2F, H) for
gate and up and (E, H, F) for down, while the state dict keeps the checkpoints' per-expert names
`{e}.gate_proj.weight`, `{e}.up_proj.weight`, `{e}.down_proj.weight`.

Routers (computed in float32, as the references compute them):
- "sigmoid" (LLaDA2.x, DeepSeek-V3 style): scores = sigmoid(logits); experts are chosen on
  scores + expert_bias within the `topk_group` best of `n_group` groups (a group's score is the
  sum of its two best); weights are the chosen experts' unbiased scores, normalised to sum 1 when
  top_k > 1, times `routed_scaling_factor`;
- "softmax" (LLaDA-MoE, OLMoE style): scores = softmax(logits) (+ expert_bias if present); the
  top_k scores are the weights, not renormalised unless `norm_topk`.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from unmask.errors import CheckpointError


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int
    top_k: int
    expert_size: int  # each routed expert's intermediate size
    shared_size: int = 0  # the shared experts' intermediate size in total (0 = none)
    first_dense: int = 0  # the first layers keep a dense FFN (first_k_dense_replace)
    dense_layers: tuple[int, ...] = ()  # further dense layers by index (LLaDA-MoE moe_layer_freq 0)
    score: str = "sigmoid"  # "sigmoid" | "softmax"
    n_group: int = 1
    topk_group: int = 1
    routed_scale: float = 1.0
    norm_topk: bool = True
    expert_bias: bool = False

    def __post_init__(self) -> None:
        for name in ("num_experts", "top_k", "expert_size", "n_group", "topk_group"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise CheckpointError(f"config.json: MoE {name} {v!r} must be a positive integer")
        if self.top_k > self.num_experts:
            raise CheckpointError(f"config.json: num_experts_per_tok {self.top_k} exceeds num_experts {self.num_experts}")
        if self.score not in ("sigmoid", "softmax"):
            raise CheckpointError(f"config.json: unsupported router score function {self.score!r} "
                                  "(supported: sigmoid, softmax)")
        if self.num_experts % self.n_group or self.topk_group > self.n_group:
            raise CheckpointError(f"config.json: {self.num_experts} experts do not split into n_group {self.n_group} "
                                  f"groups of which topk_group {self.topk_group} are kept")
        if self.n_group > 1 and self.num_experts // self.n_group < 2:
            raise CheckpointError(f"config.json: n_group {self.n_group} leaves fewer than 2 experts per group")
        if self.n_group > 1 and self.topk_group * (self.num_experts // self.n_group) < self.top_k:
            raise CheckpointError(f"config.json: topk_group {self.topk_group} groups hold fewer than "
                                  f"num_experts_per_tok {self.top_k} experts")

    def is_moe(self, layer: int) -> bool:
        return layer >= self.first_dense and layer not in self.dense_layers

    def layers_moe(self, num_layers: int) -> int:
        return sum(self.is_moe(i) for i in range(num_layers))


def route(logits: torch.Tensor, c: MoEConfig, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (T, E) float32 -> (expert ids (T, k), weights (T, k) float32)."""
    if c.score == "softmax":
        scores = torch.softmax(logits, dim=-1)
        if bias is not None:
            scores = scores + bias
        w, idx = torch.topk(scores, c.top_k, dim=-1)
        if c.norm_topk:
            w = w / w.sum(-1, keepdim=True)
        return idx, w
    scores = torch.sigmoid(logits)
    choose = scores if bias is None else scores + bias
    if c.n_group > 1:
        T = choose.shape[0]
        groups = choose.view(T, c.n_group, -1).topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(groups).scatter_(1, torch.topk(groups, c.topk_group, dim=-1, sorted=False).indices, 1)
        keep = keep[:, :, None].expand(T, c.n_group, c.num_experts // c.n_group).reshape(T, -1)
        choose = choose.masked_fill(keep == 0, float("-inf"))
    idx = torch.topk(choose, c.top_k, dim=-1).indices
    w = scores.gather(1, idx)
    if c.top_k > 1 and c.norm_topk:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return idx, w * c.routed_scale


def _grouped(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """x (N, in) sorted by expert, w (E, out, in) -> (N, out): each expert's rows times its weight.
    With gradients (training) the per-expert loop: grouped_mm has no CPU backward."""
    if not isinstance(w, torch.Tensor):  # int8 experts (unmask.layers.quant.Int8Bank): each expert's rows apart
        return w.grouped(x, offs, counts)
    training = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)
    if not training and _GROUPED.get((x.device.type, x.dtype), True):
        try:
            return F.grouped_mm(x, w.transpose(1, 2), offs=offs)
        except (RuntimeError, NotImplementedError, ValueError, TypeError):  # a device or dtype it lacks: fall back, remember
            _GROUPED[(x.device.type, x.dtype)] = False
    outs = [x[a:b] @ w[e].T for e, (a, b) in enumerate(zip((offs - counts).tolist(), offs.tolist())) if b > a]
    return torch.cat(outs) if outs else x.new_zeros(0, w.shape[1])


_GROUPED: dict = {}


class Experts(nn.Module):
    """E SwiGLU experts held stacked; per-expert checkpoint names in the state dict."""

    expert_weights = ("w_in", "w_out")  # the stacked (E, out, in) weights: what int8 quantization replaces

    def __init__(self, num: int, hidden: int, size: int) -> None:
        super().__init__()
        self.num, self.size = num, size
        self.first: int | None = None  # expert parallel: this module holds experts [first, first + num)
        self.w_in = nn.Parameter(torch.empty(num, 2 * size, hidden))  # gate rows, then up rows
        self.w_out = nn.Parameter(torch.empty(num, hidden, size))

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        if not isinstance(self.w_in, torch.Tensor):  # int8 experts keep no float weights to give back
            return
        base = self.first or 0
        for e in range(self.num):
            w_in, w_out = (self.w_in, self.w_out) if keep_vars else (self.w_in.detach(), self.w_out.detach())
            destination[f"{prefix}{base + e}.gate_proj.weight"] = w_in[e, : self.size]
            destination[f"{prefix}{base + e}.up_proj.weight"] = w_in[e, self.size :]
            destination[f"{prefix}{base + e}.down_proj.weight"] = w_out[e]

    def checkpoint_parts(self) -> dict:
        """Checkpoint key (after this module's prefix) -> (stacked weight, expert, part): how the
        per-expert tensors fill w_in (gate rows, then up rows) and w_out; a loader that quantizes
        as it reads assembles them (unmask.layers.quant.install_experts)."""
        base, out = self.first or 0, {}
        for e in range(self.num):
            out[f"{base + e}.gate_proj.weight"] = ("w_in", e, 0)
            out[f"{base + e}.up_proj.weight"] = ("w_in", e, 1)
            out[f"{base + e}.down_proj.weight"] = ("w_out", e, 0)
        return out

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        if not isinstance(self.w_in, torch.Tensor):  # quantized as read: nothing left to place
            return
        ids = range(self.first or 0, (self.first or 0) + self.num)
        names = [f"{prefix}{e}.{p}.weight" for e in ids for p in ("gate_proj", "up_proj", "down_proj")]
        absent = [n for n in names if n not in state_dict]
        if absent:
            missing_keys.extend(absent)
            return
        w_in = torch.stack([torch.cat([state_dict[f"{prefix}{e}.gate_proj.weight"],
                                       state_dict[f"{prefix}{e}.up_proj.weight"]]) for e in ids])
        w_out = torch.stack([state_dict[f"{prefix}{e}.down_proj.weight"] for e in ids])
        for n in names:
            state_dict.pop(n)  # read: the tensors now live in the stacked parameters
        if tuple(w_in.shape) != tuple(self.w_in.shape) or tuple(w_out.shape) != tuple(self.w_out.shape):
            error_msgs.append(f"{prefix}: expert weights of shape {tuple(w_in.shape)} / {tuple(w_out.shape)}, "
                              f"expected {tuple(self.w_in.shape)} / {tuple(self.w_out.shape)}")
            return
        if local_metadata.get("assign_to_params_buffers", False) or self.w_in.is_meta:
            self.w_in = nn.Parameter(w_in, requires_grad=self.w_in.requires_grad)
            self.w_out = nn.Parameter(w_out, requires_grad=self.w_out.requires_grad)
        else:
            with torch.no_grad():
                self.w_in.copy_(w_in)
                self.w_out.copy_(w_out)

    def forward(self, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x (T, H), idx (T, k) expert ids, w (T, k) weights -> (T, H): sum_k w * expert_k(x)."""
        return mix_experts(x, idx, w, self.w_in, self.w_out, F.silu, self.first)


def mix_experts(x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, w_in: torch.Tensor, w_out: torch.Tensor,
                act, first: int | None = None) -> torch.Tensor:
    """x (T, H), idx (T, k) expert ids, w (T, k) weights, w_in (E, 2F, H) gate rows then up rows,
    w_out (E, H, F), `act` the gate's activation -> (T, H): sum_k w * expert_k(x), every expert's
    tokens in one grouped multiply. `first`: w_in / w_out hold experts [first, first + E) of a
    larger set (expert parallel); only the (token, expert) pairs routed here are computed and the
    others contribute zero (the caller's all-reduce adds the ranks that hold them)."""
    if first is not None:
        return _mix_local(x, idx, w, w_in, w_out, act, first)
    T, k = idx.shape
    flat = idx.reshape(-1)
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=w_in.shape[0])
    offs = counts.cumsum(0).to(torch.int32)
    xs = x[order // k]
    h = _grouped(xs, w_in, offs, counts)
    gate, up = h.split(w_out.shape[2], dim=-1)
    ys = _grouped(act(gate) * up, w_out, offs, counts)
    y = torch.empty_like(ys)
    y[order] = ys
    return (y.view(T, k, -1).to(w.dtype) * w[..., None]).sum(1).to(x.dtype)


def _mix_local(x, idx, w, w_in, w_out, act, first: int) -> torch.Tensor:
    """mix_experts over this rank's experts [first, first + E) only."""
    T, k = idx.shape
    local = idx.reshape(-1) - first
    here = ((local >= 0) & (local < w_in.shape[0])).nonzero().squeeze(-1)  # the pairs routed to this rank
    y = torch.zeros_like(x)
    if here.numel() == 0:
        return y
    ids = local[here]
    order = ids.argsort(stable=True)
    pairs = here[order]
    counts = torch.bincount(ids, minlength=w_in.shape[0])
    offs = counts.cumsum(0).to(torch.int32)
    h = _grouped(x[pairs // k], w_in, offs, counts)
    gate, up = h.split(w_out.shape[2], dim=-1)
    ys = _grouped(act(gate) * up, w_out, offs, counts)
    weighted = (ys.to(w.dtype) * w.reshape(-1)[pairs][:, None]).to(x.dtype)
    return y.index_add_(0, pairs // k, weighted)


class SparseMoE(nn.Module):
    """Router + routed experts (+ shared experts when `shared` is given: a module taking x).
    Parameter names: gate.weight, gate.expert_bias (a buffer, when the config has one), experts.*;
    the shared experts are the family's to name (LLaDA2: mlp.shared_experts, LLaDA-MoE:
    shared_expert beside mlp)."""

    def __init__(self, c: MoEConfig, hidden: int, router: nn.Module, bias_here: bool = False) -> None:
        """`bias_here`: the expert bias is this block's buffer `expert_bias` (LLaDA-MoE), not the
        router's (LLaDA2.x `gate.expert_bias`)."""
        super().__init__()
        self.c = c
        self.gate = router
        self.experts = Experts(c.num_experts, hidden, c.expert_size)
        if bias_here and c.expert_bias:
            self.register_buffer("expert_bias", torch.zeros(c.num_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        h = x.reshape(-1, shape[-1])
        logits = F.linear(h.float(), self.gate.weight.float())
        bias = getattr(self, "expert_bias", None)
        idx, w = route(logits, self.c, getattr(self.gate, "expert_bias", None) if bias is None else bias)
        return self.experts(h, idx, w.to(x.dtype) if self.c.score == "softmax" else w).view(shape)


class Router(nn.Module):
    """The router's parameters: weight (E, H), and expert_bias (E,) as a buffer when used."""

    def __init__(self, num: int, hidden: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num, hidden))
        if bias:
            self.register_buffer("expert_bias", torch.zeros(num))
