"""Peak resident memory while loading a bf16 checkpoint, against the loaded model's own size.

Writes a LLaDA-8B-shaped checkpoint in the released layout (config.json + bf16 safetensors shards
+ index; random weights): the real embedding and head (126464 x 4096) and hidden sizes, but only
`--layers` of the 32 layers, so it takes a few GB of disk. Then, in a fresh process per setting,
loads it with unmask's loader (float32, and int8 with `quantize`) and reads the kernel's record of
the process's resident set: the peak during the load (VmHWM, reset after imports) and the
resident size after it, both above the baseline of the imported process. Ratio = peak / after:
how much more than the final model the load ever held (1.0 = nothing beyond the model).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/lean_load.py --layers 4
Writes benchmarks/results/lean_load_cpu.json. `--small` writes a tiny checkpoint instead (the
test suite's check of the same bound).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

LLADA_8B = {"d": 4096, "heads": 32, "ff": 12288, "vocab": 126464}


def write_checkpoint(folder: Path, layers: int, d: int, heads: int, ff: int, vocab: int,
                     shard_bytes: int = 2 << 30) -> int:
    """A LLaDA-layout bf16 checkpoint with random weights; returns its bytes on disk. Tensors are
    made and written shard by shard, so writing never holds more than one shard."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["LLaDAModelLM"], "model_type": "llada", "d_model": d, "n_layers": layers,
           "n_heads": heads, "n_kv_heads": heads, "mlp_hidden_size": ff, "mlp_ratio": 4, "vocab_size": vocab,
           "embedding_size": vocab, "max_sequence_length": 4096, "rope": True, "rope_theta": 500000.0,
           "rope_full_precision": True, "rms_norm_eps": 1e-5, "layer_norm_type": "rms", "block_type": "llama",
           "activation_type": "silu", "include_bias": False, "include_qkv_bias": False, "weight_tying": False,
           "alibi": False, "scale_logits": False, "block_group_size": 1, "mask_token_id": vocab - 1,
           "eos_token_id": vocab - 2, "pad_token_id": vocab - 2, "use_cache": False, "precision": "amp_bf16"}
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    shapes = {"model.transformer.wte.weight": (vocab, d)}
    for i in range(layers):
        p = f"model.transformer.blocks.{i}."
        shapes.update({p + "attn_norm.weight": (d,), p + "ff_norm.weight": (d,),
                       p + "q_proj.weight": (d, d), p + "k_proj.weight": (d, d), p + "v_proj.weight": (d, d),
                       p + "attn_out.weight": (d, d), p + "ff_proj.weight": (ff, d), p + "up_proj.weight": (ff, d),
                       p + "ff_out.weight": (d, ff)})
    shapes.update({"model.transformer.ln_f.weight": (d,), "model.transformer.ff_out.weight": (vocab, d)})
    groups, cur, size = [], [], 0
    for k, s in shapes.items():
        n = 2 * int(torch.tensor(s).prod())
        if cur and size + n > shard_bytes:
            groups.append(cur)
            cur, size = [], 0
        cur.append(k)
        size += n
    groups.append(cur)
    g = torch.Generator().manual_seed(0)
    weight_map, total = {}, 0
    for i, keys in enumerate(groups):
        name = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        part = {}
        for k in keys:
            s = shapes[k]
            part[k] = (torch.ones(s) if len(s) == 1 else torch.randn(s, generator=g) * 0.02).to(torch.bfloat16)
        save_file(part, str(folder / name), metadata={"format": "pt"})
        total += sum(t.numel() * 2 for t in part.values())
        weight_map.update({k: name for k in keys})
        del part
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return total


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def child(folder: str, quantize: str | None, kernel: str) -> dict:
    """In this (fresh) process: load, and the resident-set figures."""
    import torch

    from unmask.models.loader import load_model

    from unmask.layers.quant import trim_heap

    torch.ones(8) @ torch.ones(8)  # torch's own lazy set-up before the baseline
    trim_heap()  # what the heap holds free goes back first (the load trims it, which would lower "after")
    base = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    t = time.perf_counter()
    model, _ = load_model(folder, dtype="float32", quantize=quantize, linear_kernel=kernel)
    seconds = time.perf_counter() - t
    peak, after = _status("VmHWM") - base, _status("VmRSS") - base
    held = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    held += sum(m.weight_bytes for m in model.modules() if type(m).__name__ == "Int8Linear")  # (not buffers)
    held += sum(m.packed_bytes for m in model.modules() if type(m).__name__ == "OneDNNLinear")
    return {"quantize": quantize, "linear_kernel": kernel, "load_seconds": round(seconds, 2),
            "peak_above_baseline_bytes": peak, "after_load_bytes": after, "model_bytes": held,
            "peak_over_after": round(peak / after, 3), "peak_over_model": round(peak / held, 3)}


def measure(folder: Path, quantize: str | None, kernel: str = "default") -> dict:
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import lean_load; "
            f"print(json.dumps(lean_load.child({str(folder)!r}, {quantize!r}, {kernel!r})))")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"loading {folder} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4, help="how many of the 32 layers to write")
    ap.add_argument("--small", action="store_true", help="a tiny checkpoint (d 512, vocab 4096)")
    ap.add_argument("--dir", default=None, help="where to write the checkpoint (default: a temporary folder)")
    ap.add_argument("--out", default="benchmarks/results/lean_load_cpu.json")
    a = ap.parse_args()
    shape = {"d": 512, "heads": 8, "ff": 2048, "vocab": 4096} if a.small else LLADA_8B
    tmp = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="lean_load_"))
    folder = tmp / "ckpt"
    try:
        t = time.perf_counter()
        if (folder / "config.json").exists() and json.loads((folder / "config.json").read_text())["n_layers"] == a.layers:
            disk = json.loads((folder / "model.safetensors.index.json").read_text())["metadata"]["total_size"]
        else:
            disk = write_checkpoint(folder, a.layers, **shape, shard_bytes=(64 << 20) if a.small else (2 << 30))
        print(f"have {disk / 2**30:.2f} GiB bf16 ({a.layers} layers, {shape}) in {time.perf_counter() - t:.0f} s")
        runs = []
        for quantize, kernel in ((None, "default"), (None, "auto"), ("int8", "default"), ("int8", "auto"),
                                 ("int4", "default")):
            r = measure(folder, quantize, kernel)
            runs.append(r)
            print(f"{quantize or 'float32':8} kernel {kernel:8} load {r['load_seconds']:6.1f} s  peak "
                  f"{r['peak_above_baseline_bytes'] / 2**30:6.2f} GiB  after {r['after_load_bytes'] / 2**30:6.2f} GiB  "
                  f"model {r['model_bytes'] / 2**30:6.2f} GiB  peak/after {r['peak_over_after']:.2f}  "
                  f"peak/model {r['peak_over_model']:.2f}")
        out = {"benchmark": "lean_load", "checkpoint": {"layout": "LLaDA-8B (released names, bf16, sharded)",
                                                        "layers": a.layers, **shape, "bytes": disk},
               "timing": "load_model only (fresh process; RSS from /proc/self/status, baseline after imports)",
               "runs": runs}
        if not a.small:
            from unmask.files import write_json_atomic

            write_json_atomic(Path(a.out), out)
            print(f"wrote {a.out}")
        else:
            print(json.dumps(out))
    finally:
        if not a.dir:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
