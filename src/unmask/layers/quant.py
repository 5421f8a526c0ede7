"""int8 weights for linear layers (`--quantize int8`, `LLM(..., quantize="int8")`).

Each weight matrix is stored as int8 with one float scale per output channel (symmetric: scale =
max |w| of the row / 127), and multiplied by PyTorch's own dynamic quantized linear
(`quantized::linear_dynamic`, FBGEMM on x86): it quantizes its input per tensor on the fly (7-bit
range, as PyTorch's x86 default, so the int8 products cannot overflow), multiplies in int8 with
int32 accumulation and returns float. No hand-written matmul.

Activations are quantized **per row**, not per tensor: each row x is mapped affinely onto exactly
[-1, 1] (x' = (x - c) / a, its own centre c and half-range a, its extremes written as exactly -1
and 1), so the tensor's range, hence the kernel's one scale, is the same whatever the other rows
hold; the output is a (W x') + c (W 1) + bias, with W 1 the int8 weight's row sums. A request's
output therefore does not depend on what else is in the batch (the engine's invariant), and the
accuracy is that of per-row scales (on the AR twin, greedy outputs equal to float32 on 133 of 140
prompts against 103 of 140 with the kernel's per-tensor scale).

What stays in floating point under int8, by choice: the token embedding (a lookup: nothing to
multiply), the output head (its logits decide every commit and are few rows), routers (`gate`,
`router.proj`: their scores pick experts) and norms. Under int4, whose point is memory (an 8B
model's float32 embedding and head alone are 4 GiB), an untied head is an Int8Linear and the token
embedding an Int8Embedding (int8 rows, a scale per token); a head tied to the embedding stays
float. The stacked expert weights of mixture-of-experts layers are
quantized per expert (Int8Bank), as they are read like every other weight. A forward hook on a replaced module (tensor parallelism's all-reduce) moves to its int8
replacement.
"""

import ctypes
import warnings

import torch
from torch import nn

from unmask.layers.dispatch import replace, routers

QUANTIZE = ("int8", "int4")  # int4: unmask.layers.int4 (its own kernel)


PACK_ROWS = 16384  # output rows packed for FBGEMM at a time (an output head's 126464 in 8 blocks)


class Int8Linear(nn.Module):
    """nn.Linear's forward over an int8 weight with per-output-channel scales."""

    def __init__(self, in_features: int, out_features: int, packed, rowsum: torch.Tensor,
                 bias: torch.Tensor | None, weight_bytes: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self._packed = packed  # FBGEMM's prepacked int8 weight (no bias): blocks of output rows
        self.register_buffer("rowsum", rowsum, persistent=False)  # W 1 of the int8 weight, dequantized
        self.register_buffer("bias", bias, persistent=False)
        self.weight_bytes = weight_bytes

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Int8Linear":
        return cls.from_weight(linear.weight.detach(), linear.bias, linear)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None, like: nn.Module | None = None) -> "Int8Linear":
        """From a float weight (out, in); `like`: the module replaced (its forward hooks move here)."""
        if weight.device.type != "cpu":
            raise ValueError("int8 linear layers run on CPU (FBGEMM) only")
        q, scale = quantize_rows(weight)
        return cls.from_int8(q, scale, bias, like)

    @classmethod
    def from_int8(cls, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                  like: nn.Module | None = None) -> "Int8Linear":
        """From int8 weights (out, in) and their per-output-channel scales (out,)."""
        scale = scale.double()
        packed = []
        with warnings.catch_warnings():  # PyTorch marks its quantized tensor types deprecated (issue 184982)
            warnings.simplefilter("ignore")
            for i in range(0, q.shape[0], PACK_ROWS):  # packing copies the weight: a block at a time (lean)
                rows, zero = q[i : i + PACK_ROWS], torch.zeros(min(PACK_ROWS, q.shape[0] - i), dtype=torch.long)
                qw = torch._make_per_channel_quantized_tensor(rows, scale[i : i + PACK_ROWS], zero, 0)
                packed.append(torch.ops.quantized.linear_prepack(qw, None))
                del qw
        rowsum = torch.cat([q[i : i + 4096].sum(1, dtype=torch.int64) for i in range(0, q.shape[0], 4096)])
        rowsum = (rowsum.double() * scale).float()  # (by row chunks: a sum casts its whole input first)
        bias = None if bias is None else bias.detach().float()
        out = cls(q.shape[1], q.shape[0], packed, rowsum, bias, q.numel() + 4 * scale.numel())
        if like is not None:
            out._forward_hooks.update(like._forward_hooks)  # e.g. a row-parallel all-reduce
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        unit, a, c = unit_rows(h)
        if len(self._packed) == 1:
            y = torch.ops.quantized.linear_dynamic(unit, self._packed[0], True)
        else:  # every block quantizes the same input alike: the columns are those of one call
            y = torch.cat([torch.ops.quantized.linear_dynamic(unit, p, True) for p in self._packed], -1)
        flat = y.view(-1, self.out_features)
        flat.mul_(a.view(-1, 1)).addr_(c.view(-1), self.rowsum)  # a (W x') + c (W 1)
        if self.bias is not None:
            y += self.bias
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel"


def unit_rows(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row of h affinely onto [-1, 1]: (x', a, c) with h = c + a x', the row's largest element
    written as exactly 1 and its smallest as exactly -1 (at another column when the row is
    constant), so every row, hence the whole tensor, spans exactly [-1, 1]."""
    hi, top = h.max(-1, keepdim=True)
    lo, bottom = h.min(-1, keepdim=True)
    c = (hi + lo) / 2
    inv = 2 / (hi - lo).clamp(min=2e-12)
    unit = torch.addcmul(-c * inv, h, inv).clamp_(-1, 1)
    if h.shape[-1] > 1:
        bottom = torch.where(bottom == top, (top + 1) % h.shape[-1], bottom)
    unit.scatter_(-1, top, 1.0).scatter_(-1, bottom, -1.0)
    return unit, 1 / inv, c


class Int8Embedding(nn.Module):
    """nn.Embedding's lookup over int8 rows with one float scale per token (symmetric, the row's
    max |w| / 127, as quantize_rows): a quarter of float32's memory, each looked-up row
    dequantized."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = q.shape
        self.register_buffer("q", q.to(torch.int8), persistent=False)
        self.register_buffer("scale", scale.float(), persistent=False)

    @classmethod
    def from_weight(cls, weight: torch.Tensor) -> "Int8Embedding":
        return cls(*quantize_rows(weight.detach()))

    @property
    def weight_bytes(self) -> int:
        return self.q.numel() + 4 * self.scale.numel()

    def dequantized(self) -> torch.Tensor:
        return self.q.float() * self.scale[:, None]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.q[ids].float() * self.scale[ids].unsqueeze(-1)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, int8 per token"


def trim_heap() -> None:
    """Hand the memory the C heap holds free back to the system (glibc's malloc_trim; nothing where
    there is no glibc). Quantizing weight after weight frees large temporaries whose space glibc
    otherwise keeps: without it resident memory grew twice as fast as the int4 weights made, and
    an 8B int4 model built layer by layer peaked at 2.4x its weights."""
    global _trim
    if _trim is None:
        try:
            _trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _trim = False
    if _trim:
        _trim(0)


_trim = None


def small_ends(method: str) -> bool:
    """Whether `method` also puts an untied output head and the token embedding in int8 (int4 does)."""
    return method == "int4"


def ends(model: nn.Module) -> tuple[str, str] | None:
    """(token embedding's name, output head's name) of a model whose head is its own nn.Linear and
    whose embedding is an nn.Embedding; None otherwise (a tied head, or no `parts`)."""
    if not hasattr(model, "parts"):
        return None
    embed, _, _, head = model.parts()
    if not isinstance(head, nn.Linear) or not isinstance(embed, nn.Embedding):
        return None
    names = {id(m): n for n, m in model.named_modules()}
    return names[id(embed)], names[id(head)]


class Int8Bank:
    """The stacked (E, out, in) weights of a mixture-of-experts layer in int8: one Int8Linear per
    expert. `grouped` is unmask.layers.moe's grouped multiply for it: the rows sorted by expert go
    through their expert's layer, one FBGEMM call per expert that has rows (PyTorch has no grouped
    int8 multiply on CPU)."""

    def __init__(self, weight: torch.Tensor | None = None, layers: list | None = None) -> None:
        """From a float (E, out, in) weight, or from E Int8Linear `layers`."""
        self.layers = layers if layers is not None else [Int8Linear.from_weight(w, None) for w in weight]
        first = self.layers[0]
        self.shape = (len(self.layers), first.out_features, first.in_features)
        self.weight_bytes = sum(m.weight_bytes for m in self.layers)

    def grouped(self, x: torch.Tensor, offs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        starts, ends = torch.stack([offs - counts, offs]).tolist()  # one host sync per layer and step
        outs = [self.layers[e](x[a:b]) for e, (a, b) in enumerate(zip(starts, ends)) if b > a]
        return torch.cat(outs) if outs else x.new_zeros(0, self.shape[1])


def expert_parts(model: nn.Module) -> dict:
    """Checkpoint key -> (module name, stacked weight, expert, part) for every mixture-of-experts
    module that describes its checkpoint layout (`checkpoint_parts`)."""
    out = {}
    for name, module in model.named_modules():
        if hasattr(module, "checkpoint_parts") and getattr(module, "expert_weights", ()):
            for key, where in module.checkpoint_parts().items():
                out[f"{name}.{key}"] = (name, *where)
    return out


def install_experts(model: nn.Module, parts: dict, read: dict) -> int:
    """Put Int8Banks built from `read` (checkpoint key -> (int8 rows, scales), each tensor viewed as
    rows of its last dimension) into the modules `parts` (expert_parts) names; returns how many."""
    pieces: dict = {}
    for key, (name, attr, expert, part) in parts.items():
        pieces.setdefault((name, attr), []).append((expert, part, read[key]))
    for (name, attr), got in pieces.items():
        module = model.get_submodule(name)
        num = getattr(module, attr).shape[0]
        layers = []
        if got[0][0] is None:  # one tensor holds every expert, rows stacked
            q, scale = got[0][2]
            rows = q.shape[0] // num
            layers = [Int8Linear.from_int8(q[e * rows:(e + 1) * rows], scale[e * rows:(e + 1) * rows], None)
                      for e in range(num)]
        else:
            by_expert: dict = {}
            for expert, part, qs in got:
                by_expert.setdefault(expert, []).append((part, qs))
            for e in range(num):
                ordered = [qs for _, qs in sorted(by_expert[e], key=lambda x: x[0])]
                layers.append(Int8Linear.from_int8(torch.cat([q for q, _ in ordered]),
                                                   torch.cat([s for _, s in ordered]), None))
        del module._parameters[attr]
        object.__setattr__(module, attr, Int8Bank(layers=layers))
    return len(pieces)


def quantize_experts(model: nn.Module) -> int:
    """Replace the stacked expert weights of every mixture-of-experts layer (modules that name them
    in `expert_weights`) by Int8Banks, in place; returns how many."""
    n = 0
    for module in model.modules():
        for name in getattr(module, "expert_weights", ()):
            w = getattr(module, name)
            if not isinstance(w, torch.Tensor) or w.is_meta:
                continue
            bank = Int8Bank(w.detach())
            del module._parameters[name]
            object.__setattr__(module, name, bank)
            n += 1
    return n


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of a float weight -> (int8 rows, float64 scale per row): symmetric, scale = max |w| / 127.
    Row by row, so a loader can quantize a tensor in chunks of rows as it reads them."""
    w = w.to(torch.float32, copy=True)  # one copy, rounded in place (lean: the loader's row chunks)
    scale = (w.abs().amax(1) / 127).clamp(min=1e-12).double()
    return w.div_(scale[:, None].float()).round_().clamp_(-127, 127).to(torch.int8), scale


def targets(model: nn.Module, head: nn.Module | None = None) -> list[str]:
    """The names of the linear layers `quantize_model` replaces: all but `head` and the routers."""
    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear) and m is not head
            and name.rsplit(".", 1)[-1] != "lm_head" and not routers(name)]


def check_method(method: str) -> None:
    if method not in QUANTIZE:
        raise ValueError(f"unknown quantization {method!r}; choose {', '.join(QUANTIZE)}")


def quantize_model(model: nn.Module, method: str, head: nn.Module | None = None) -> int:
    """Replace every nn.Linear of `model` (but `head` and the routers) by its `method` version, in
    place, each float weight freed as soon as its quantized copy exists (int4: the expert weights of
    mixture-of-experts layers, and layers whose inputs are not in groups of 32, in int8; an untied
    head and the token embedding in int8, `small_ends`). Returns how many were replaced.
    (Loading a checkpoint quantizes each weight as it is read instead: unmask.models.loader.)"""
    check_method(method)
    from unmask.layers.int4 import GROUP, Int4Linear

    names = targets(model, head)
    for name in names:
        m = model.get_submodule(name)
        if method == "int4" and m.in_features % GROUP == 0:
            replace(model, name, Int4Linear.from_linear(m))
        else:  # int8, or int4's fallback for a layer whose inputs are not in groups of 32
            replace(model, name, Int8Linear.from_linear(m))
        m.weight = None  # the float copy goes now, not at the end
        trim_heap()
    pair = ends(model) if small_ends(method) else None
    if pair is not None:
        embed, out = (model.get_submodule(n) for n in pair)
        replace(model, pair[0], Int8Embedding.from_weight(embed.weight))
        replace(model, pair[1], Int8Linear.from_linear(out))
        embed.weight = out.weight = None
    return len(names) + 2 * (pair is not None) + quantize_experts(model)
