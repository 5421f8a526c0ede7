"""Before / after benchmark of the request engine: two source trees, measured in one run,
interleaved, best of --repeats workers per tree, each the best of 3 decodes (this machine's speed
drifts by a third between runs).

    git worktree add /tmp/before <commit>
    OMP_WAIT_POLICY=PASSIVE python benchmarks/engine_ab.py --before /tmp/before/src --after src

For each tree, in its own subprocess (PYTHONPATH = that tree's src), alternating which tree goes
first in each repeat:
- step time of every row kind, batch 1 and 8: the embedded models (masked "default", block
  "default-block", the AR twin "default-ar", renoising "default-renoise", speculative "default-ar"
  with the drafter "default-dflash") and the 25 M shape (random-weight LLaDA architecture, 8
  layers, d 512, dual cache); ms per engine step over the whole decode (every forward and the
  loop; not tokenisation or loading), and a hash of the generated tokens (the two trees must
  agree: the quality is the same tokens);
- the cost of a request joining and of one leaving (abort) while 64 rows of the 25 M model run
  (prompt 256, gen 128: their K/V rows exist);
- with --serve, benchmarks/serve_load.py's continuous mode at two rates (a server per tree).
Writes JSON (--out) and prints a table: per measurement the best of each tree and after/before.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

HERE = Path(__file__).resolve().parent
INNER = 3  # each decode runs this many times inside a worker (its best counts), on top of --repeats


# --- the worker (runs inside one tree) ------------------------------------------------------------
def _hash(seqs) -> str:
    return hashlib.sha1(json.dumps(seqs).encode()).hexdigest()[:12]


def _decode(engine, prompts, params) -> tuple[float, int, list]:
    import torch
    reqs = [engine.add_request(p, params) for p in prompts]
    steps, t0 = 0, time.perf_counter()
    with torch.inference_mode():
        while engine.has_unfinished():
            engine.step()
            steps += 1
    return (time.perf_counter() - t0) * 1000 / steps, steps, [q.canvas for q in reqs]


def _prompts(batch: int, length: int, vocab: int, avoid: set, seed: int = 0) -> list[list[int]]:
    import torch
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(batch):
        ids = [t for t in torch.randint(4, vocab - 4, (length * 2,), generator=g).tolist() if t not in avoid]
        out.append(ids[:length])
    return out


def _llada25m():
    import torch
    from unmask.models.base import ArchConfig, TokenIds
    from unmask.models.llada import LLaDAModel
    V = 512
    torch.manual_seed(0)
    model = LLaDAModel(ArchConfig("llada", V, 512, 8, 8, 8, 1376, 500000.0, 1e-5, 8192)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
        model.model.transformer.ff_out.weight[V - 1] = -1  # never propose MASK
    return model, TokenIds(mask=V - 1, eos=V - 2, pad=V - 2, stop=(V - 2,))


def worker(batches: list[int]) -> dict:
    import torch
    from unmask import LLM
    from unmask.engine import Engine, EngineConfig
    from unmask.params import GenerationParams
    torch.set_num_threads(int(os.environ.get("AB_THREADS", "2")))
    out = {}
    run_on = {"gen_length": 64, "early_stop": False}  # random prompts: the embedded models would stop at once
    kinds = [("masked default", "default", None, run_on),
             ("block default-block", "default-block", None, run_on),
             ("causal default-ar", "default-ar", None, run_on),
             ("renoise default-renoise", "default-renoise", None, {"gen_length": 64, "seed": 0}),
             ("speculative default-ar+dflash", "default-ar", "default-dflash", run_on)]
    for label, name, draft, given in kinds:
        llm = LLM(name, draft=draft)
        params = llm.default_params(**given)
        ids = llm.token_ids
        avoid = {t for t in (ids.mask, *ids.stop) if t is not None}
        for b in batches:
            prompts = _prompts(b, 24, llm.arch.vocab_size, avoid)
            runs = [_decode(llm.engine(EngineConfig(max_num_seqs=b, trace_limit=None)), prompts, params)
                    for _ in range(INNER)]
            out[f"{label} b{b}"] = {"ms_per_step": min(r[0] for r in runs), "steps": runs[0][1],
                                    "tokens": _hash(runs[0][2])}
    model, tokens = _llada25m()
    params = GenerationParams(gen_length=128, block_length=32, steps=32, cache="dual", early_stop=False).check()
    for b in batches:
        prompts = _prompts(b, 256, 512, {510, 511})
        runs = [_decode(Engine(model, tokens, EngineConfig(max_num_seqs=b, trace_limit=None)), prompts, params)
                for _ in range(INNER)]
        out[f"masked 25M dual b{b}"] = {"ms_per_step": min(r[0] for r in runs), "steps": runs[0][1],
                                        "tokens": _hash(runs[0][2])}
    # join / leave with 64 running rows whose K/V exist
    engine = Engine(model, tokens, EngineConfig(max_num_seqs=80, trace_limit=None))
    for p in _prompts(64, 256, 512, {510, 511}, seed=1):
        engine.add_request(p, params)
    with torch.inference_mode():
        engine.step()
        extra = _prompts(5, 256, 512, {510, 511}, seed=2)
        joins, leaves = [], []
        for p in extra:
            req = engine.add_request(p, params)
            t0 = time.perf_counter()
            engine._admit()
            joins.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            engine.abort(req.id)
            leaves.append(time.perf_counter() - t0)
    out["join at 64 rows (25M, K/V rows)"] = {"ms": 1000 * min(joins)}
    out["leave at 64 rows (25M, K/V rows)"] = {"ms": 1000 * min(leaves)}
    return out


# --- the driver -----------------------------------------------------------------------------------
def run_tree(src: str, batches: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve()), "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.run([sys.executable, __file__, "--worker", "--batches", batches], env=env,
                          capture_output=True, text=True, timeout=3600)
    if proc.returncode:
        raise SystemExit(f"worker for {src} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_serve(src: str, rates: str, out_dir: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve()), "OMP_WAIT_POLICY": "PASSIVE"}
    out_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, str(HERE / "serve_load.py"), "--modes", "continuous", "--rates", rates,
                    "--requests", "120", "--max-seconds", "8", "--out", str(out_dir)], env=env, check=True,
                   capture_output=True, text=True, timeout=1800)
    data = json.loads((out_dir / "serve_load.json").read_text())
    return {f"serve continuous @{row['offered_rps']:g}/s": {"throughput": row["throughput_rps"],
                                                          "ttft_p50": row["ttft_s"]["p50"],
                                                          "ttft_p95": row["ttft_s"]["p95"]}
            for row in data["results"]["continuous"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--before", default="/tmp/before/src")
    ap.add_argument("--after", default=str(HERE.parent / "src"))
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--serve", action="store_true", help="also serve_load.py's continuous mode, per tree")
    ap.add_argument("--rates", default="50,200")
    ap.add_argument("--out", default=str(HERE / "results" / "engine_ab.json"))
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker([int(b) for b in a.batches.split(",")])))
        return
    trees = {"before": a.before, "after": a.after}
    runs = {k: [] for k in trees}
    serve = {k: [] for k in trees}
    for rep in range(a.repeats):
        order = list(trees) if rep % 2 == 0 else list(trees)[::-1]
        for name in order:
            t0 = time.perf_counter()
            runs[name].append(run_tree(trees[name], a.batches))
            print(f"repeat {rep + 1} {name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
            if a.serve:
                serve[name].append(run_serve(trees[name], a.rates, Path(f"/tmp/engine_ab_serve_{name}_{rep}")))
    table = {}
    for key in runs["after"][0]:
        metric = "ms_per_step" if "ms_per_step" in runs["after"][0][key] else "ms"
        best = {t: min(r[key][metric] for r in runs[t]) for t in trees}
        row = {"metric": metric, **best, "after/before": best["after"] / best["before"]}
        toks = {t: {r[key].get("tokens") for r in runs[t]} for t in trees}
        if toks["after"] != {None}:
            row["same_tokens"] = toks["after"] == toks["before"] and len(toks["after"]) == 1
            row["steps"] = runs["after"][0][key]["steps"]
        table[key] = row
    if a.serve:
        for key in serve["after"][0]:
            best = {t: {"throughput": max(s[key]["throughput"] for s in serve[t]),
                        "ttft_p50": min(s[key]["ttft_p50"] for s in serve[t]),
                        "ttft_p95": min(s[key]["ttft_p95"] for s in serve[t])} for t in trees}
            table[key] = {"metric": "requests/s; ttft s (best)", **best}
    import platform
    import torch
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor() or platform.machine()) if Path("/proc/cpuinfo").exists() else platform.machine()
    result = {"setup": {"machine": cpu, "cpus": os.cpu_count(),
                        "torch": torch.__version__, "threads": int(os.environ.get("AB_THREADS", "2")),
                        "repeats": a.repeats, "best_of": "min ms (max throughput)", "before": a.before,
                        "after": a.after, "timing": "every forward and the loop, not loading or tokenisation"},
              "results": table}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))
    for key, row in table.items():
        if "after/before" in row:
            same = "" if "same_tokens" not in row else ("  same tokens" if row["same_tokens"] else "  TOKENS DIFFER")
            print(f"{key:40s} {row['metric']:12s} before {row['before']:9.2f}  after {row['after']:9.2f}  "
                  f"x{row['after/before']:.2f}{same}")
        else:
            print(f"{key:40s} before {row['before']}  after {row['after']}")


if __name__ == "__main__":
    main()
