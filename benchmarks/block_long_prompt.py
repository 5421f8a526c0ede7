"""Long prompts: a block-diffusion model with its exact cache against a full-attention model with
DualCache, on the same random-weight 25 M-parameter architecture (benchmarks/step_time.py's).

Both decode gen 256 in blocks of 32 with the same commits per step (the fixed schedule, 8 tokens
per step, 4 steps per block), batch 1, early stop off, through the request engine. Per request:
wall time; per forward kind: count, positions computed and mean time — full-attention: "full"
(a block-start refresh of the whole canvas) and "window" (a cached step over the block); block
model: "full" (the prefill: prompt and first block), "window" (the open block) and "seal" (the
seal forward, fused with the next block's first step: two blocks). Beside each, the roofline
prediction for this machine (bandwidth and FLOP/s measured now; attention reads and FLOPs
included, every forward attending to the whole canvas: an upper bound for the block model).
Random weights: the tokens are meaningless, only the time is measured. Writes JSON and prints.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/block_long_prompt.py
"""

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from unmask.bench.hardware import measure_cpu  # noqa: E402
from unmask.bench.roofline import ModelCost, Roofline  # noqa: E402
from unmask.bench.runner import context  # noqa: E402
from unmask.engine.engine import Engine  # noqa: E402
from unmask.models.llada import LLaDAModel  # noqa: E402
from unmask.files import writable_folder, write_json_atomic  # noqa: E402
from unmask.params import GenerationParams  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from step_time import TOKENS, VOCAB, build_model  # noqa: E402


def block_twin(model: LLaDAModel, block: int) -> LLaDAModel:
    """The same weights with block-diffusion attention (config bd_size)."""
    twin = LLaDAModel(replace(model.config, block_size=block)).eval()
    twin.load_state_dict(model.state_dict())
    return twin


def run(model, prompt_len: int, gen: int, block: int, steps: int, cache: str, roof: Roofline, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, VOCAB - 3, (prompt_len,), generator=g).tolist()
    params = GenerationParams(gen_length=gen, block_length=block, steps=steps, cache=cache, early_stop=False).check()
    engine = Engine(model, TOKENS)
    t0 = time.perf_counter()
    engine.add_request(prompt, params)
    while engine.has_unfinished():
        engine.step()
    wall = time.perf_counter() - t0
    L = prompt_len + gen
    kinds = {}
    for f in engine.trace:
        k = kinds.setdefault(f.kind, {"count": 0, "positions": [], "ms": [], "predicted_ms": []})
        k["count"] += 1
        k["positions"].append(f.positions)
        k["ms"].append(1e3 * f.seconds)
        k["predicted_ms"].append(1e3 * roof.step(f.positions, L))
    by_kind = {name: {"count": k["count"], "positions_mean": statistics.mean(k["positions"]),
                      "ms_mean": statistics.mean(k["ms"]), "predicted_ms_mean": statistics.mean(k["predicted_ms"])}
               for name, k in kinds.items()}
    return {"model": "block diffusion" if model.config.block_size else "full attention", "cache": cache,
            "prompt_len": prompt_len, "gen_length": gen, "block_length": block, "steps": steps,
            "forwards": len(engine.trace), "seconds_per_request": wall,
            "predicted_seconds_per_request": sum(sum(k["predicted_ms"]) for k in kinds.values()) / 1e3,
            "by_kind": by_kind}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--ff", type=int, default=1376)
    ap.add_argument("--prompts", default="512,2048")
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--steps", type=int, default=32, help="total steps: 32 = 4 per block of 32, 8 tokens per step")
    ap.add_argument("--out", default="benchmarks/results/block_long_prompt_cpu.json")
    a = ap.parse_args()

    full = build_model(a.layers, a.d, a.heads, a.ff)
    block = block_twin(full, a.block)
    hw = measure_cpu()
    roof = Roofline(hw, ModelCost.from_arch(full.config, 4.0, attention=True))
    run(full, 64, 64, a.block, 8, "dual", roof)  # warm-up
    run(block, 64, 64, a.block, 8, "exact", roof)
    rows = []
    print(f"{'model':15} {'cache':6} {'prompt':>6} {'forwards':>8} {'s/request':>10} {'pred s':>7}   per kind: "
          "count x positions, ms (predicted ms)")
    for p in map(int, a.prompts.split(",")):
        for model, cache in ((full, "dual"), (block, "exact")):
            r = run(model, p, a.gen, a.block, a.steps, cache, roof)
            rows.append(r)
            kinds = "  ".join(f"{k}: {v['count']}x{v['positions_mean']:.0f}, {v['ms_mean']:.1f} ({v['predicted_ms_mean']:.1f})"
                              for k, v in r["by_kind"].items())
            print(f"{r['model']:15} {cache:6} {p:6d} {r['forwards']:8d} {r['seconds_per_request']:10.2f} "
                  f"{r['predicted_seconds_per_request']:7.2f}   {kinds}")
    speedups = {}
    for p in map(int, a.prompts.split(",")):
        f = next(r for r in rows if r["prompt_len"] == p and r["cache"] == "dual")
        b = next(r for r in rows if r["prompt_len"] == p and r["cache"] == "exact")
        speedups[p] = f["seconds_per_request"] / b["seconds_per_request"]
        print(f"prompt {p}: block diffusion is {speedups[p]:.2f}x faster per request than full-attention DualCache")
    setup = {"model": "random-weight LLaDA architecture, and the same weights with bd_size", "layers": a.layers,
             "d_model": a.d, "heads": a.heads, "mlp_hidden": a.ff, "vocab": VOCAB, "block_size": a.block,
             "params_no_embedding": full.config.num_parameters(False), "dtype": "float32", "batch": 1,
             "policy": f"fixed, {a.gen // a.steps} tokens per step", "early_stop": False,
             "timing": "every forward and the engine's loop for one request; no tokenisation"}
    result = {"benchmark": "block_long_prompt", "context": context(), "setup": setup, "hardware_measured": hw.__dict__,
              "results": rows, "speedup_block_vs_dual": speedups, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    out = Path(a.out)
    writable_folder(out.parent, "output folder")
    write_json_atomic(out, result)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
