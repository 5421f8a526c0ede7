"""The machines the roofline model (unmask.bench.roofline) prices: GPU presets from their
datasheets (bf16 dense), and this CPU, measured (its memory bandwidth and the compute rate of the
linear layer the engine runs for each weight type)."""

import functools
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    name: str
    bandwidth: float  # bytes per second
    peak_flops: float  # FLOP per second in the model's dtype


PRESETS = {
    "h100-sxm": Hardware("H100 SXM (bf16 dense)", 3.352e12, 989.4e12),
    "h200": Hardware("H200 SXM (bf16 dense)", 4.8e12, 989.4e12),
    "a100-80gb": Hardware("A100 80GB SXM (bf16 dense)", 2.039e12, 312e12),
}


WEIGHTS = {"float32": 4.0, "int8": 1.0}


@functools.cache
def _bandwidth(seconds: float) -> float:
    """Bytes per second of a large float32 copy (read + write), measured once per process."""
    import torch

    a = torch.empty(64 * 2**20 // 4, dtype=torch.float32).uniform_()
    b = torch.empty_like(a)
    b.copy_(a)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        b.copy_(a)
        n += 1
    return 2 * a.numel() * 4 * n / (time.perf_counter() - t0)


def measure_cpu(seconds: float = 0.5, weights: str = "float32") -> Hardware:
    """This machine, measured once: bandwidth from a large float32 copy; the compute rate from the
    linear layer the engine runs for `weights` (float32: the faster of PyTorch's default and oneDNN,
    unmask.layers.dispatch; int8: unmask.layers.quant's FBGEMM layer) on a 4096 x 4096 weight over
    256 rows, where a step is compute-bound."""
    import torch
    from torch import nn

    bandwidth = _bandwidth(seconds / 3)
    rows, size = 256, 4096
    lin = nn.Linear(size, size, bias=False).requires_grad_(False)
    if weights == "int8":
        from unmask.layers.quant import Int8Linear

        layers = {"int8 (FBGEMM)": Int8Linear.from_linear(lin)}
    else:
        from unmask.layers.dispatch import OneDNNLinear, onednn_available

        layers = {"float32 (default)": lin}
        if onednn_available():
            layers["float32 (oneDNN)"] = OneDNNLinear.from_linear(lin)
    x = torch.randn(rows, size)
    best = {}
    with torch.no_grad():
        for name, layer in layers.items():
            layer(x)
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds / (3 * len(layers)) or n < 2:
                layer(x)
                n += 1
            best[name] = 2 * rows * size * size * n / (time.perf_counter() - t0)
    kernel = max(best, key=best.get)
    return Hardware(f"this CPU ({torch.get_num_threads()} threads, {kernel}, measured)", bandwidth, best[kernel])


def for_device(device) -> Hardware:
    """The hardware a measurement runs on: a preset for a GPU it knows by name (datasheet
    numbers), else this CPU, measured."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, preset in (("H200", "h200"), ("H100", "h100-sxm"), ("A100", "a100-80gb")):
            if key in name:
                return PRESETS[preset]
        raise ValueError(f"no roofline preset for GPU {name!r}")
    return measure_cpu()
