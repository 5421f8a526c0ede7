"""unmask's int4 layer (unmask.layers.int4: 4-bit weights in groups of 32, its own AVX512-VNNI /
AVX2 kernel) against its int8 layer (PyTorch's FBGEMM) and float32 (oneDNN over a reordered
weight, and PyTorch's default), on LLaDA-8B's weight shapes (random) at the row counts a denoising
step multiplies (1 = an AR step; 8-64 = a block of 8-32 positions at batch 1-2; 256 = batch 8 of
32), interleaved, best of `--repeats`; the layer call only (int4 and int8 include quantizing the
activations). "int4 Q4_K" is the int4 layer a GGUF Q4_K tensor becomes (its nibbles, and its
minimums as per-group offsets multiplied by an int8 layer over the groups' input sums).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/int4_kernels.py   # -> benchmarks/results/int4_kernels_cpu.json
"""

import argparse
import os
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from unmask.bench.runner import context  # noqa: E402
from unmask.files import write_json_atomic  # noqa: E402
from unmask.layers.dispatch import OneDNNLinear  # noqa: E402
from unmask.layers.int4 import Int4Linear, kernel, quantize_groups  # noqa: E402
from unmask.layers.quant import Int8Linear  # noqa: E402

from int8_kernels import layer_ms  # noqa: E402  (benchmarks/, beside this script)

SHAPES = {"attention 4096x4096": (4096, 4096), "mlp up 4096->12288": (4096, 12288),
          "mlp down 12288->4096": (12288, 4096)}
ROWS = (1, 8, 16, 32, 64, 256)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default="benchmarks/results/int4_kernels_cpu.json")
    a = ap.parse_args()
    torch.manual_seed(0)
    res = {"benchmark": "int4_kernels", "context": context(), "isa": kernel().isa(),
           "timing": f"the layer call only, best of {a.repeats}, interleaved", "shapes": {}}
    for name, (cols, out) in SHAPES.items():
        lin = nn.Linear(cols, out, bias=False).requires_grad_(False)
        lin.weight.mul_(0.02 / lin.weight.std())
        layers = {"float32 default": lin, "float32 oneDNN": OneDNNLinear(lin.weight),
                  "int8 (FBGEMM)": Int8Linear.from_linear(lin), "int4 (unmask)": Int4Linear.from_linear(lin),
                  "int4 Q4_K": Int4Linear(*quantize_groups(lin.weight), offsets=0.002 * torch.randn(out, cols // 32))}
        ms = layer_ms(layers, cols, ROWS, a.repeats)
        print(name)
        for k, v in ms.items():
            print(f"  {k:18}" + "".join(f"{rows:>5}: {t:7.2f}" for rows, t in v.items()))
        ratio = {r: round(ms["int4 (unmask)"][r] / ms["int8 (FBGEMM)"][r], 3) for r in ROWS}
        ratio_k = {r: round(ms["int4 Q4_K"][r] / ms["int8 (FBGEMM)"][r], 3) for r in ROWS}
        print("  int4 / int8      " + "".join(f"{r:>5}: {v:7.2f}" for r, v in ratio.items()), flush=True)
        print("  int4 Q4_K / int8 " + "".join(f"{r:>5}: {v:7.2f}" for r, v in ratio_k.items()), flush=True)
        res["shapes"][name] = {"ms": {k: {str(r): round(t, 3) for r, t in v.items()} for k, v in ms.items()},
                               "int4_over_int8": {str(r): v for r, v in ratio.items()},
                               "int4_q4_k_over_int8": {str(r): v for r, v in ratio_k.items()},
                               "weight_bytes": {"float32": 4 * cols * out, "int8": layers["int8 (FBGEMM)"].weight_bytes,
                                                "int4": layers["int4 (unmask)"].weight_bytes,
                                                "int4 Q4_K": layers["int4 Q4_K"].weight_bytes}}
    write_json_atomic(Path(a.out), res)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
