"""Step-time benchmark of the request engine on a random-weight LLaDA-architecture model.

Measures, per cache mode and batch size: ms per step (refresh steps and cached steps apart), the
canvas columns recomputed per step, and the loop's own overhead (step time minus time inside the
model's forward: proposal, commit policy, bookkeeping, host syncs). Then how a dual-cache step
scales with block length and with sequence length.

Random weights: the commit pattern is not meaningful, so the number of steps is fixed by the
schedule (--steps) and early stop is off; the timing covers every forward and the loop, not
tokenisation. Writes JSON (default benchmarks/results/step_time_cpu.json) and prints a table.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/step_time.py
"""

import argparse
import os
import resource
import statistics
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from unmask.bench.runner import context  # noqa: E402
from unmask.engine import Engine, EngineConfig  # noqa: E402
from unmask.models.base import ArchConfig, TokenIds  # noqa: E402
from unmask.models.llada import LLaDAModel  # noqa: E402
from unmask.files import writable_folder, write_json_atomic  # noqa: E402
from unmask.params import GenerationParams  # noqa: E402

VOCAB = 512
TOKENS = TokenIds(mask=VOCAB - 1, eos=VOCAB - 2, pad=VOCAB - 2, stop=(VOCAB - 2,))


def build_model(layers: int, d: int, heads: int, ff: int, seed: int = 0) -> LLaDAModel:
    torch.manual_seed(seed)
    cfg = ArchConfig("llada", VOCAB, d, layers, heads, heads, ff, 500000.0, 1e-5, 8192)
    model = LLaDAModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
        model.model.transformer.ff_out.weight[TOKENS.mask] = -1  # never propose MASK
    return model


class ForwardTimer:
    """Accumulates wall time spent inside model.forward."""

    def __init__(self, model):
        self.model, self.seconds, self.calls = model, 0.0, 0
        self._orig = model.forward
        model.forward = self

    def __call__(self, *a, **k):
        t = time.perf_counter()
        out = self._orig(*a, **k)
        if out.is_cuda:
            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - t
        self.calls += 1
        return out

    def close(self):
        del self.model.forward


def decode(model, prompts, params) -> list[tuple[float, bool, float]]:
    """The batch through the engine: per step, (seconds, a refresh step, positions per row)."""
    engine = Engine(model, TOKENS, EngineConfig(max_num_seqs=len(prompts), trace_limit=None))
    for p in prompts:
        engine.add_request(p, params)
    steps = []
    while engine.has_unfinished():
        n0, t0 = len(engine.trace), time.perf_counter()
        engine.step()
        recs = list(engine.trace)[n0:]  # this step's forwards (one each here: no verifying cache)
        steps.append((time.perf_counter() - t0, recs[0].refresh, recs[0].positions))
    return steps


def run(model, prompt_len, gen, block, steps, batch, cache, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, VOCAB - 3, (batch, prompt_len), generator=g).tolist()
    params = GenerationParams(gen_length=gen, block_length=block, steps=steps, cache=cache, early_stop=False).check()
    timer = ForwardTimer(model)
    t0 = time.perf_counter()
    out = decode(model, prompts, params)
    wall = time.perf_counter() - t0
    timer.close()
    refresh = [s for s, r, _ in out if r]
    cached = [s for s, r, _ in out if not r]
    step_total = sum(s for s, _, _ in out)
    return {
        "cache": cache, "batch": batch, "prompt_len": prompt_len, "gen_length": gen, "block_length": block,
        "steps": len(out),
        "ms_per_step": 1000 * step_total / len(out),
        "ms_refresh_step": 1000 * statistics.mean(refresh) if refresh else None,
        "ms_cached_step": 1000 * statistics.mean(cached) if cached else None,
        "positions_refresh": max(p for _, _, p in out),
        "positions_cached_mean": statistics.mean(p for _, r, p in out if not r) if cached else None,
        "forward_seconds": timer.seconds,
        "loop_overhead_fraction": (step_total - timer.seconds) / step_total,
        "wall_seconds": wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--ff", type=int, default=1376)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--steps", type=int, default=32, help="total steps (schedule); 32 = 4 per block of 32")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--scaling", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--out", default="benchmarks/results/step_time_cpu.json")
    a = ap.parse_args()

    model = build_model(a.layers, a.d, a.heads, a.ff)
    setup = {"model": "random-weight LLaDA architecture", "layers": a.layers, "d_model": a.d, "heads": a.heads,
             "mlp_hidden": a.ff, "vocab": VOCAB, "params_no_embedding": model.config.num_parameters(False),
             "dtype": "float32", "policy": "fixed", "loop": "the request engine (unmask.engine), one batch",
             "timing": "each engine step: every forward, commit and bookkeeping; no tokenisation"}
    run(model, 64, 32, 32, 4, 1, "dual")  # warm-up
    rows = []
    print(f"{'cache':7} {'batch':>5} {'steps':>5} {'ms/step':>9} {'refresh':>9} {'cached':>9} "
          f"{'cols(refresh/cached mean)':>21} {'loop overhead':>14}")
    for batch in map(int, a.batches.split(",")):
        for cache in ("none", "prefix", "dual"):
            r = run(model, a.prompt, a.gen, a.block, a.steps, batch, cache)
            rows.append(r)
            cached = f"{r['ms_cached_step']:.1f}" if r["ms_cached_step"] else "-"
            print(f"{cache:7} {batch:5d} {r['steps']:5d} {r['ms_per_step']:9.1f} {r['ms_refresh_step']:9.1f} "
                  f"{cached:>9} {r['positions_refresh']:>10}/{r['positions_cached_mean'] or 0:<10.0f} "
                  f"{100 * r['loop_overhead_fraction']:13.1f}%")
    scaling = {}
    if a.scaling:
        print("\ndual-cache step time vs block length (prompt %d) and vs prompt length (block %d), batch 1:" % (a.prompt, a.block))
        by_block = [run(model, a.prompt, a.gen, b, a.gen // b * 2, 1, "dual") for b in (8, 16, 32, 64)]
        by_len = [run(model, p, a.gen, a.block, a.steps, 1, "dual") for p in (128, 512, 1024)]
        for r in by_block:
            print(f"  block {r['block_length']:3d}: {r['ms_cached_step']:7.1f} ms per cached step")
        for r in by_len:
            print(f"  prompt {r['prompt_len']:5d} (L={r['prompt_len'] + a.gen}): {r['ms_cached_step']:7.1f} ms per cached step")
        scaling = {"by_block_length": by_block, "by_prompt_length": by_len}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {"benchmark": "step_time", "context": context(), "setup": setup,
              "results": rows, "dual_scaling": scaling, "peak_rss_mib": peak,
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    out = Path(a.out)
    writable_folder(out.parent, "output folder")
    write_json_atomic(out, result)
    print(f"\npeak RSS {peak:.0f} MiB; wrote {out}")


if __name__ == "__main__":
    main()
