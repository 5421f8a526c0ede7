"""Renoising against masking at equal size and equal forwards, on the task suite.

The embedded masked-diffusion model (3.4 M parameters), its AR twin, and the renoising model
trained by `unmask train --kind renoise` (DiffusionGemma's layout at the same width and depth,
3.8 M parameters; `runs/renoise/model` by default) decode the same held-out examples of the
report split (the first --n of each task, examples 250.. of its held-out stream: nothing here
was chosen on them). Settings at matched forward budgets: the masked model's fixed schedule at
1, 2 and 4 tokens per step (24, 12, 6 forwards for the 24-token canvas) against the renoising
model's max_denoising_steps 24, 12, 6 (its adaptive stopping may use fewer), plus each model's
defaults (the masked model's threshold 0.9 + DualCache; the renoising model's 48-step release
default) and the AR twin. Accuracy is exact match; the paired difference against the masked
1-token-per-step baseline carries a bootstrap 95 % interval. Speed: batch 8 over all examples,
batch 1 over the first --n1 of each task, timing the decode (every forward and the loop; not
tokenisation). Unseeded sampling draws from torch's global generator, seeded once per setting.
Writes JSON (default benchmarks/results/renoise/report.json) and prints a table.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/renoise_vs_masked.py --renoise runs/renoise/model
"""

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from unmask import LLM  # noqa: E402
from unmask.bench.runner import context  # noqa: E402
from unmask.bench.stats import paired_bootstrap, wilson_interval  # noqa: E402
from unmask.evaluate import run_task  # noqa: E402
from unmask.files import writable_folder, write_json_atomic  # noqa: E402
from unmask.tasks import TASKS  # noqa: E402


def settings(masked: LLM, renoise: LLM, ar: LLM) -> list[tuple[str, LLM, object]]:
    fixed = lambda k: masked.default_params(policy="fixed", steps=24 // k, cache="none", block_length=24)  # noqa: E731
    out = [("masked 1 tok/step (24 forwards)", masked, fixed(1)), ("masked 2 tok/step (12)", masked, fixed(2)),
           ("masked 4 tok/step (6)", masked, fixed(4)), ("masked default: threshold 0.9 + DualCache", masked,
                                                         masked.default_params())]
    for s in (24, 12, 6):
        out.append((f"renoise max {s} steps", renoise, renoise.default_params(max_denoising_steps=s)))
    out.append(("renoise default (max 48 steps)", renoise, renoise.default_params()))
    out.append(("AR twin", ar, ar.default_params()))
    return out


def measure(llm: LLM, params, n: int, batch: int, split: str, seed: int) -> dict:
    torch.manual_seed(seed)
    flags, per_task, seconds, tokens, forwards = [], {}, 0.0, 0, 0
    for task in TASKS:
        run = run_task(llm, task, n, params, batch, split=split)
        flags += run.flags
        per_task[task] = sum(run.flags) / run.n
        seconds, tokens, forwards = seconds + run.seconds, tokens + run.tokens, forwards + run.row_forwards
    return {"flags": flags, "per_task": per_task, "seconds": seconds, "tokens": tokens,
            "forwards_per_example": forwards / len(flags), "tokens_per_s": tokens / seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--renoise", default="runs/renoise/model")
    ap.add_argument("--n", type=int, default=150, help="examples per task (batch 8: accuracy and speed)")
    ap.add_argument("--n1", type=int, default=20, help="examples per task timed at batch 1")
    ap.add_argument("--split", default="report")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/renoise/report.json")
    a = ap.parse_args()
    writable_folder(os.path.dirname(a.out) or ".", "--out")
    masked, ar, renoise = LLM(), LLM("default-ar"), LLM(a.renoise)
    rows = []
    for name, llm, params in settings(masked, renoise, ar):
        t0 = time.perf_counter()
        b8 = measure(llm, params, a.n, 8, a.split, a.seed)
        b1 = measure(llm, params, a.n1, 1, a.split, a.seed)
        rows.append({"setting": name, "params": {k: v for k, v in vars(params).items() if v is not None},
                     "batch8": b8, "batch1": {k: v for k, v in b1.items() if k != "flags"}})
        print(f"{name:45s} acc {sum(b8['flags']) / len(b8['flags']):6.1%} forwards {b8['forwards_per_example']:5.1f} "
              f"tok/s b8 {b8['tokens_per_s']:6.0f} b1 {b1['tokens_per_s']:6.0f}  ({time.perf_counter() - t0:.0f} s)",
              flush=True)
    base = rows[0]["batch8"]["flags"]
    for r in rows:
        f = r["batch8"]["flags"]
        lo, hi = wilson_interval(sum(f), len(f))
        d, dlo, dhi = paired_bootstrap(f, base)
        r["accuracy"], r["accuracy_ci"], r["vs_baseline"] = sum(f) / len(f), [lo, hi], [d, dlo, dhi]
    print(f"\n{'setting':45s} {'accuracy [95% CI]':>22} {'vs masked 1 tok/step':>24} {'fwd/ex':>7} "
          f"{'tok/s b1':>9} {'tok/s b8':>9}")
    for r in rows:
        lo, hi = r["accuracy_ci"]
        d, dlo, dhi = r["vs_baseline"]
        print(f"{r['setting']:45s} {r['accuracy']:7.1%} [{lo:5.1%}, {hi:5.1%}] {100 * d:+6.1f} [{100 * dlo:+5.1f}, "
              f"{100 * dhi:+5.1f}] {r['batch8']['forwards_per_example']:7.1f} {r['batch1']['tokens_per_s']:9.0f} "
              f"{r['batch8']['tokens_per_s']:9.0f}")
    for r in rows:
        print(f"{r['setting']:45s} " + " ".join(f"{t} {100 * v:5.1f}" for t, v in r["batch8"]["per_task"].items()))
    write_json_atomic(a.out, {"context": context(), "setup": vars(a), "rows": rows})
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
