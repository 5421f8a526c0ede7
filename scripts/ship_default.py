"""Copy the trained models into the package and record their held-out accuracy.

    python scripts/ship_default.py [--n 200]          # default and default-ar
    python scripts/ship_default.py --block [--n 200]  # default-block, from runs/block
    python scripts/ship_default.py --edit [--n 200]   # default-edit, from runs/edit
    python scripts/ship_default.py --renoise [--n 200]  # default-renoise, from runs/renoise
    python scripts/ship_default.py --dflash [--n 200]   # default-dflash (the AR twin's drafter), from runs/dflash
    python scripts/ship_default.py --code --threshold T [--n 40]  # default-code and default-code-ar,
                                                    # from runs/code-diffusion and runs/code-ar

Writes src/unmask/assets/{default,default-ar,default-block}/ (config, weights, tokenizer,
generation defaults, training.json) and eval.json beside each: exact match and token accuracy per
task on the first n held-out examples, one token per step in low-confidence order (the AR twin:
greedy with its KV cache; the block model: its own blocks with its exact cache; the renoising
model: its own sampler at its defaults, every request seeded 0). The test suite
checks that the shipped models reproduce these numbers.
"""

import argparse
import json
import shutil
import time
from pathlib import Path

from unmask import LLM, GenerationParams
from unmask.evaluate import evaluate, run_task
from unmask.tasks import TASKS

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "src" / "unmask" / "assets"
KEEP = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
        "special_tokens_map.json", "training.json")


def lineage(run: Path) -> list[dict]:
    """The phases this model was trained in, earliest first, followed through `init_from`:
    each phase's configuration, steps, wall time and last held-out check."""
    phases = []
    while run is not None:
        meta = json.loads((run / "model" / "training.json").read_text())
        evals = [h for h in meta["history"] if "held_out_exact" in h]
        phases.append({"run": run.name, "config": meta["config"], "step": meta["step"],
                       "elapsed_seconds": round(meta["elapsed_seconds"], 1),
                       "last_check": evals[-1] if evals else None})
        parent = meta["config"].get("init_from")
        if parent in ("default", "default-ar", "default-block"):  # an embedded model: its own recorded lineage
            phases += json.loads((ASSETS / parent / "training.json").read_text()).get("lineage", [])[::-1]
            break
        run = (ROOT / parent) if parent else None
    return phases[::-1]


def ship(run: Path, name: str, n: int) -> None:
    dst = ASSETS / name
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for f in KEEP:
        shutil.copy(run / "model" / f, dst / f)
    meta = json.loads((dst / "training.json").read_text())
    meta["lineage"] = lineage(run)
    (dst / "training.json").write_text(json.dumps(meta, indent=2))
    llm = LLM(dst)
    g = llm.generation_defaults["gen_length"]
    block = llm.arch.block_size or g
    if llm.arch.canvas_length:  # a renoising model: its own sampler, seeded (deterministic, batch-invariant)
        params = llm.default_params(seed=0)
    else:
        params = GenerationParams(gen_length=g, block_length=block, steps=g,
                                  cache="exact" if llm.arch.block_size else "none")
    t0 = time.time()
    results = evaluate(llm, n=n, params=params, batch_size=100)
    table = {"n": n, "params": params.__dict__, "seconds": round(time.time() - t0, 1),
             "results": [dict(r.row(), exact_first_100=sum(r.flags[:100]) / min(100, n)) for r in results]}
    (dst / "eval.json").write_text(json.dumps(table, indent=2))
    print(name, json.dumps({r.task: round(100 * r.exact, 1) for r in results}))


def ship_dflash(run: Path, n: int) -> None:
    """The AR twin's DFlash drafter: its released-layout folder, and eval.json: per task on the
    first n held-out examples, the AR twin's exact match alone and with the drafter, how many
    outputs are identical (all: lossless), and tau (tokens per verify forward after the prefill)."""
    dst = ASSETS / "default-dflash"
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for f in ("config.json", "model.safetensors", "training.json"):
        shutil.copy(run / "model" / f, dst / f)
    ar, spec = LLM("default-ar"), LLM("default-ar", draft=dst)
    params = ar.default_params(gen_length=24)
    rows = []
    t0 = time.time()
    for task in TASKS:
        a, d = run_task(ar, task, n, params, 100), run_task(spec, task, n, params, 100)
        ids = [[r.token_ids for o in run.outputs for r in o.results] for run in (a, d)]
        res = [r for o in d.outputs for r in o.results]
        verifies = sum(r.nfe - 1 for r in res)
        rows.append({"task": task, "n": n, "exact_ar": sum(a.flags) / n, "exact_dflash": sum(d.flags) / n,
                     "identical": sum(x == y for x, y in zip(*ids)), "nfe_ar": a.row_forwards / n,
                     "nfe_dflash": d.row_forwards / n,
                     "tau": sum(r.num_tokens - 1 for r in res if r.nfe > 1) / max(verifies, 1)})
    (dst / "eval.json").write_text(json.dumps({"n": n, "params": params.__dict__, "seconds": round(time.time() - t0, 1),
                                               "results": rows}, indent=2))
    print("default-dflash", json.dumps({r["task"]: round(r["tau"], 2) for r in rows}))


def ship_code(run: Path, name: str, n: int, defaults: dict) -> None:
    """A code model (unmask/train/code.py): its folder with the weights stored in bfloat16 (loaded
    as float32; half the size), its generation defaults, and eval.json: exact match of the first
    n single-line holes of the test split (the diffusion model: both sides, oracle length, one
    token per step; the twin: prefix-suffix-middle, greedy), as the shipped weights give it."""
    import torch
    from safetensors.torch import load_file, save_file

    from unmask.train.code import hole_examples, hole_matches

    dst = ASSETS / name
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for f in KEEP:
        if (run / "model" / f).exists():
            shutil.copy(run / "model" / f, dst / f)
    weights = load_file(dst / "model.safetensors")
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()}, dst / "model.safetensors",
              metadata={"format": "pt"})
    gen = json.loads((dst / "generation_config.json").read_text())
    (dst / "generation_config.json").write_text(json.dumps({**gen, **defaults}, indent=2))
    meta = json.loads((dst / "training.json").read_text())
    meta["lineage"] = lineage(run)
    meta["stored_dtype"] = "bfloat16 (trained in float32; loaded as float32)"
    (dst / "training.json").write_text(json.dumps(meta, indent=2))
    llm = LLM(dst)
    exs = hole_examples(llm.tokenizer, "test", "single", n)
    flags = [hole_matches(llm, e) for e in exs]
    table = {"n": len(exs), "task": "single-line holes of the test split (unmask.train.code.hole_examples), "
             "exact match of the output's first line",
             "exact": sum(flags) / len(flags), "flags": flags}
    (dst / "eval.json").write_text(json.dumps(table, indent=2))
    print(name, f"exact {table['exact']:.3f} on {len(exs)} single-line test holes")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--runs", default=str(ROOT / "runs"))
    ap.add_argument("--diffusion", default="reverse", help="the run of the last diffusion phase")
    ap.add_argument("--block", action="store_true", help="ship the block-diffusion model (runs/block) only")
    ap.add_argument("--edit", action="store_true", help="ship the editing block-diffusion model (runs/edit) only")
    ap.add_argument("--renoise", action="store_true", help="ship the renoising model (runs/renoise) only")
    ap.add_argument("--dflash", action="store_true", help="ship the AR twin's DFlash drafter (runs/dflash) only")
    ap.add_argument("--code", action="store_true", help="ship the code models (runs/code-diffusion, runs/code-ar) only")
    ap.add_argument("--threshold", type=float, default=None, help="--code: the fast threshold chosen on the selection "
                    "split (benchmarks/code_infill.py)")
    a = ap.parse_args()
    if a.code:
        if a.threshold is None:
            ap.error("--code needs --threshold (chosen on the selection split by benchmarks/code_infill.py)")
        shape = {"gen_length": 64, "block_length": 32, "steps": 64}
        ship_code(Path(a.runs) / "code-diffusion", "default-code", a.n,
                  {**shape, "policy": "threshold", "threshold": a.threshold, "cache": "dual",
                   "hole_length": "consensus"})  # trained on exact-length spans (docs/infilling.md)
        ship_code(Path(a.runs) / "code-ar", "default-code-ar", a.n, {**shape, "block_length": 64})
        return
    if a.dflash:
        ship_dflash(Path(a.runs) / "dflash", a.n)
        return
    if a.renoise:
        ship(Path(a.runs) / "renoise", "default-renoise", a.n)
        return
    if a.edit:
        ship(Path(a.runs) / "edit", "default-edit", a.n)
        return
    if a.block:
        ship(Path(a.runs) / "block2", "default-block", a.n)
        return
    ship(Path(a.runs) / a.diffusion, "default", a.n)
    ship(Path(a.runs) / "ar", "default-ar", a.n)


if __name__ == "__main__":
    main()
