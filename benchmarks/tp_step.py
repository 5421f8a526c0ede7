"""Tensor parallelism on this CPU: a denoising forward at N = 1 and N = 2 ranks.

A random-weight LLaDA-architecture checkpoint (written here, in the released layout, with the
embedded model's tokenizer) is decoded through `LLM.generate` with a fixed schedule (no cache:
every step is a full forward over prompt + canvas), at batch 1 and 8, under three setups:
one process with 2 threads, one process with 1 thread, and 2 ranks (gloo) with 1 thread each.
The time per forward is the generation's decoding time over its forwards (every forward, the
sampler, the commit and, for N = 2, the collectives and the lockstep broadcast; not tokenisation,
not loading). Random weights: quality is not meaningful here; the tokens at N = 2 are checked
equal to N = 1. Writes JSON (default benchmarks/results/tp_step_cpu.json) and prints a table.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/tp_step.py
"""

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from unmask import LLM  # noqa: E402
from unmask.bench.runner import context  # noqa: E402
from unmask.files import writable_folder, write_json_atomic  # noqa: E402
from unmask.loading import EMBEDDED  # noqa: E402
from unmask.models.base import ArchConfig  # noqa: E402
from unmask.models.llada import LLaDAModel  # noqa: E402


def write_checkpoint(folder: Path, layers: int, d: int, heads: int, ff: int, vocab: int) -> Path:
    src = EMBEDDED["default"]
    cfg = json.loads((src / "config.json").read_text())
    cfg.update({"d_model": d, "n_layers": layers, "n_heads": heads, "n_kv_heads": heads, "mlp_hidden_size": ff,
                "embedding_size": vocab, "vocab_size": vocab, "weight_tying": False})
    torch.manual_seed(0)
    arch = ArchConfig("llada", vocab, d, layers, heads, heads, ff, 500000.0, 1e-5, 4096)
    model = LLaDAModel(arch)
    state = {k: (torch.randn_like(v) * 0.02 if v.dim() > 1 else torch.ones_like(v)) for k, v in model.state_dict().items()}
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(cfg))
    for f in src.iterdir():
        if f.name not in ("config.json", "model.safetensors") and f.is_file():
            shutil.copy(f, folder / f.name)
    return folder


def per_forward(llm, batch: int, prompt: int, gen: int, steps: int, repeats: int):
    ids = [[5 + (i + j) % 40 for j in range(prompt)] for i in range(batch)]
    params = {"gen_length": gen, "block_length": gen, "steps": steps, "cache": "none", "early_stop": False}
    best, tokens = None, None
    for _ in range(repeats):
        out = llm.generate(ids, params)
        nfe = max(r.nfe for r in out.results)
        s = out.seconds / nfe
        best = s if best is None else min(best, s)
        tokens = [r.token_ids for r in out.results]
    return best, tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--ff", type=int, default=1408)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--gen", type=int, default=192)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/tp_step_cpu.json")
    a = ap.parse_args()
    out = writable_folder(Path(a.out).parent, "--out") / Path(a.out).name
    batches = [int(b) for b in a.batches.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = write_checkpoint(Path(tmp) / "m", a.layers, a.d, a.heads, a.ff, a.vocab)
        params = sum(t.numel() for t in LLM(path).model.parameters())
        ref = {}
        for name, world, threads in (("1 process, 2 threads", 1, 2), ("1 process, 1 thread", 1, 1),
                                     ("2 ranks (gloo), 1 thread each", 2, 1)):
            torch.set_num_threads(threads)
            t0 = time.perf_counter()
            llm = LLM(path, tensor_parallel=world)
            start = time.perf_counter() - t0
            for b in batches:
                s, toks = per_forward(llm, b, a.prompt, a.gen, a.steps, a.repeats)
                ref.setdefault(b, toks)
                rows.append({"setup": name, "ranks": world, "threads_per_rank": threads, "batch": b,
                             "ms_per_forward": 1000 * s, "start_s": start, "tokens_equal_n1": toks == ref[b]})
                print(f"{name:32s} batch {b}: {1000 * s:8.1f} ms/forward  (start {start:.1f} s, "
                      f"tokens equal to N=1: {toks == ref[b]})", flush=True)
            llm.close()
    L = a.prompt + a.gen
    # what N = 2 adds per forward: an all-reduce of (B, L, d) after each attention and MLP and the
    # embedding, and the sampler's (max, sum, argmax, logit) statistics per position
    comm = {b: {"all_reduces": 2 * a.layers + 1, "bytes_per_all_reduce": b * L * a.d * 4,
                "vocab_stats_bytes": b * a.gen * 5 * 8} for b in batches}
    result = {"context": context(), "model": {"family": "llada", "layers": a.layers, "d_model": a.d, "heads": a.heads,
                                              "mlp": a.ff, "vocab": a.vocab, "parameters": params},
              "shape": {"prompt": a.prompt, "gen": a.gen, "positions_per_forward": L, "steps": a.steps, "cache": "none"},
              "timing_includes": "LLM.generate's decoding time over its forwards: every forward, sampler, commit, "
                                 "collectives and the lockstep broadcast; not tokenisation or loading",
              "communication_per_forward": comm, "rows": rows}
    write_json_atomic(out, result)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
