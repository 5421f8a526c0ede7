"""Which int8 kernel is faster on this CPU: unmask's int8 layer (PyTorch's FBGEMM dynamic linear,
unmask.layers.quant) or torchao's (int8 weight-only; int8 dynamic activation + int8 weight), with
float32 through oneDNN and PyTorch's default beside them. One LLaDA-8B MLP weight (4096 x 12288,
random), 1 / 8 / 32 / 256 rows, interleaved, best of `--repeats`; the layer call only.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/int8_kernels.py   # -> benchmarks/results/int8_kernels_cpu.json
"""

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from unmask.bench.runner import context  # noqa: E402
from unmask.files import write_json_atomic  # noqa: E402
from unmask.layers.dispatch import OneDNNLinear  # noqa: E402
from unmask.layers.quant import Int8Linear  # noqa: E402


@torch.no_grad()
def layer_ms(layers: dict, cols: int, rows: tuple, repeats: int) -> dict:
    """name -> {rows: best ms of one call on random (rows, cols) input}: every layer once as a
    warm-up, then `repeats` rounds in which each layer is called once in turn (interleaved, so a
    drift of the machine's speed hits all alike)."""
    ms: dict = {k: {} for k in layers}
    for r in rows:
        x = torch.randn(r, cols)
        for layer in layers.values():
            layer(x)
        for _ in range(repeats):
            for k, layer in layers.items():
                t = time.perf_counter()
                layer(x)
                ms[k][r] = min(ms[k].get(r, float("inf")), 1e3 * (time.perf_counter() - t))
    return ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/int8_kernels_cpu.json")
    a = ap.parse_args()
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_

    torch.manual_seed(0)
    lin = nn.Linear(4096, 12288, bias=False).requires_grad_(False)
    layers = {"float32 default": lin, "float32 oneDNN": OneDNNLinear.from_linear(lin),
              "int8 unmask (FBGEMM)": Int8Linear.from_linear(lin)}
    for name, config in (("int8 torchao weight-only", Int8WeightOnlyConfig()),
                         ("int8 torchao dynamic activation", Int8DynamicActivationInt8WeightConfig())):
        m = nn.Sequential(nn.Linear(4096, 12288, bias=False))
        m[0].weight.data.copy_(lin.weight)
        quantize_(m, config)
        layers[name] = m.requires_grad_(False)
    ms = layer_ms(layers, 4096, (1, 8, 32, 256), a.repeats)
    for k, v in ms.items():
        print(f"{k:34}" + "".join(f"{rows:>5} rows {t:8.2f} ms" for rows, t in v.items()))
    write_json_atomic(Path(a.out), {"benchmark": "int8_kernels", "context": context(), "weight": [12288, 4096],
                                    "timing": f"the layer call only, best of {a.repeats}, interleaved",
                                    "ms": {k: {str(r): round(t, 3) for r, t in v.items()} for k, v in ms.items()}})
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
