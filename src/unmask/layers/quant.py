"""int8 weights for linear layers (`--quantize int8`, `LLM(..., quantize="int8")`).

Each weight matrix is stored as int8 with one float scale per output channel (symmetric: scale =
max |w| of the row / 127), and multiplied by PyTorch's own dynamic quantized linear
(`quantized::linear_dynamic`, FBGEMM on x86): the activations are quantized per tensor on the
fly (7-bit range, as PyTorch's x86 default, so the int8 products cannot overflow), the product is
an int8 GEMM with int32 accumulation, the output float. No hand-written matmul.

What stays in floating point, by choice: the token embedding (a lookup: nothing to multiply), the
output head (its logits decide every commit and are few rows), routers (`gate`, `router.proj`:
their scores pick experts), norms, and the grouped expert tensors of mixture-of-experts layers
(not quantized yet). A forward hook on a replaced module (tensor parallelism's all-reduce) moves
to its int8 replacement.
"""

import warnings

import torch
from torch import nn

QUANTIZE = ("int8",)


class Int8Linear(nn.Module):
    """nn.Linear's forward over an int8 weight with per-output-channel scales."""

    def __init__(self, in_features: int, out_features: int, packed, bias: torch.Tensor | None,
                 weight_bytes: int) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self._packed = packed  # FBGEMM's prepacked int8 weight and float bias
        self.weight_bytes = weight_bytes
        self.bias_dtype = None if bias is None else bias.dtype

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Int8Linear":
        w = linear.weight.detach().float()
        if w.device.type != "cpu":
            raise ValueError("int8 linear layers run on CPU (FBGEMM) only")
        scale = (w.abs().amax(1) / 127).clamp(min=1e-12).double()
        q = torch.round(w / scale[:, None].float()).clamp(-127, 127).to(torch.int8)
        zero = torch.zeros(w.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # PyTorch marks its quantized tensor types deprecated (issue 184982)
            warnings.simplefilter("ignore")
            qw = torch._make_per_channel_quantized_tensor(q, scale, zero, 0)
            bias = None if linear.bias is None else linear.bias.detach().float()
            packed = torch.ops.quantized.linear_prepack(qw, bias)
        out = cls(w.shape[1], w.shape[0], packed, bias, q.numel() + 4 * scale.numel())
        out._forward_hooks.update(linear._forward_hooks)  # e.g. a row-parallel all-reduce
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.quantized.linear_dynamic(x.float() if x.dtype != torch.float32 else x, self._packed, True)
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel"


def _skipped(name: str, module: nn.Module, head: nn.Module | None) -> bool:
    last = name.rsplit(".", 1)[-1]
    return module is head or last in ("gate", "lm_head") or name.endswith("router.proj")


def quantize_model(model: nn.Module, method: str, head: nn.Module | None = None) -> int:
    """Replace every nn.Linear of `model` (but `head` and the routers) by its `method` version, in
    place, each float weight freed as soon as its int8 copy exists. Returns how many were replaced."""
    if method not in QUANTIZE:
        raise ValueError(f"unknown quantization {method!r}; choose {', '.join(QUANTIZE)}")
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear) and not _skipped(name, m, head)]
    for name, m in targets:
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, child, Int8Linear.from_linear(m))
        m.weight = None  # the float copy goes now, not at the end
    return len(targets)
