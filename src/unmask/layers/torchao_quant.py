"""Quantized weights on GPU through torchao (`--quantize int8` / `fp8` on a CUDA device).

On a GPU the linear layers (the same ones unmask.layers.quant replaces on CPU: all but the head
and the routers) are quantized in place by torchao's `quantize_`:
- "int8": int8 weights, one scale per output channel (`Int8WeightOnlyConfig`), activations in
  the model's dtype: half the bytes of bf16 for a memory-bound step;
- "fp8": float8 (e4m3) weights and activations, dynamically scaled
  (`Float8DynamicActivationFloat8WeightConfig`), which needs a GPU with float8 tensor cores
  (compute capability 8.9 or newer: Ada, Hopper, Blackwell).
The grouped expert weights of mixture-of-experts layers stay in the model's dtype here.

torchao is an optional dependency (`pip install torchao`); the code path itself runs on CPU too
(torchao's reference kernels), which is how the tests check it.
"""

from torch import nn

GPU_METHODS = ("int8", "fp8")


def torchao_config(method: str):
    """torchao's config for `method`, or ImportError / ValueError naming what is missing."""
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, Int8WeightOnlyConfig

    if method == "int8":
        return Int8WeightOnlyConfig()
    if method == "fp8":
        return Float8DynamicActivationFloat8WeightConfig()
    raise ValueError(f"unknown quantization {method!r} for torchao; choose {', '.join(GPU_METHODS)}")


def quantize_torchao(model: nn.Module, method: str, head: nn.Module | None = None) -> int:
    """Quantize the linear layers of `model` (but `head` and the routers) with torchao, in place;
    returns how many."""
    from torchao.quantization import quantize_

    from unmask.layers.quant import targets

    names = set(targets(model, head))
    quantize_(model, torchao_config(method), filter_fn=lambda module, fqn: fqn in names)
    return len(names)
