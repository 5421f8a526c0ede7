"""DFlash speculative decoding against the AR twin alone, paired, on the held-out report split.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/dflash.py [--draft default-dflash] [--n 100] [--batches 1,8]

For each batch size and task: the first N examples of the report split (held-out examples
250..), decoded by the AR twin alone and by the AR twin verifying its drafter's blocks (the
request engine: unmask.engine.speculative), interleaved, best of `--repeats` timings. Reported:
exact match of both, how many outputs are identical token for token (lossless: all of them),
tau = generated tokens per verify forward (the prefill's first token aside; DFlash's "acceptance
length": accepted drafts + the target's bonus token), target and drafter forwards, tokens/s and
the speed-up. Greedy, gen 24, float32. Timing: the decode of each batch (every forward of both
models and the loop), tokenisation excluded. Writes benchmarks/results/dflash_cpu.json.
"""

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from unmask import LLM  # noqa: E402
from unmask.bench.runner import TIMER_INCLUDES, context  # noqa: E402
from unmask.evaluate import run_task  # noqa: E402
from unmask.files import write_json_atomic  # noqa: E402
from unmask.tasks import TASKS  # noqa: E402


def summary(run) -> dict:
    res = [r for o in run.outputs for r in o.results]
    verifies = sum(max(r.nfe - 1, 0) for r in res)
    return {"exact": sum(run.flags) / run.n, "tokens": run.tokens, "seconds": run.seconds,
            "tokens_per_s": run.tokens / run.seconds, "target_forwards": sum(r.nfe for r in res),
            "draft_forwards": sum(r.draft_forwards for r in res),
            "batched_forwards": sum(o.nfe for o in run.outputs), "batched_drafts": sum(o.draft_forwards for o in run.outputs),
            "verifies": verifies, "after_prefill": sum(r.num_tokens - 1 for r in res if r.nfe > 1),
            "tau": sum(r.num_tokens - 1 for r in res if r.nfe > 1) / verifies if verifies else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default-ar")
    ap.add_argument("--draft", default="default-dflash")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/dflash_cpu.json")
    a = ap.parse_args()
    ar = LLM(a.model)
    spec = LLM(a.model, draft=a.draft)
    params = ar.default_params(gen_length=24)
    tasks = a.tasks.split(",")
    rows = []
    run_task(spec, tasks[0], 4, params, 4)  # warm-up
    run_task(ar, tasks[0], 4, params, 4)
    for batch in map(int, a.batches.split(",")):
        for task in tasks:
            best, runs = {}, {}
            for _ in range(a.repeats):
                for how, llm in (("ar", ar), ("dflash", spec)):
                    run = run_task(llm, task, a.n, params, batch, split="report")
                    if run.seconds < best.get(how, float("inf")):
                        best[how], runs[how] = run.seconds, run
            ids = {how: [r.token_ids for o in run.outputs for r in o.results] for how, run in runs.items()}
            row = {"batch": batch, "task": task, "n": a.n, "ar": summary(runs["ar"]), "dflash": summary(runs["dflash"]),
                   "identical": sum(x == y for x, y in zip(ids["ar"], ids["dflash"]))}
            row["speedup"] = row["dflash"]["tokens_per_s"] / row["ar"]["tokens_per_s"]
            rows.append(row)
            d = row["dflash"]
            print(f"b{batch} {task:8} exact AR {100 * row['ar']['exact']:5.1f}% DFlash {100 * d['exact']:5.1f}%  "
                  f"identical {row['identical']}/{a.n}  tau {d['tau'] or 0:4.2f}  "
                  f"{row['ar']['tokens_per_s']:7.1f} -> {d['tokens_per_s']:7.1f} tok/s  x{row['speedup']:.2f}", flush=True)
    totals = []
    for batch in sorted({r["batch"] for r in rows}):
        mine = [r for r in rows if r["batch"] == batch]
        tok = {h: sum(r[h]["tokens"] for r in mine) for h in ("ar", "dflash")}
        sec = {h: sum(r[h]["seconds"] for r in mine) for h in ("ar", "dflash")}
        ver = sum(r["dflash"]["verifies"] for r in mine)
        t = {"batch": batch, "examples": sum(r["n"] for r in mine), "identical": sum(r["identical"] for r in mine),
             "ar_tokens_per_s": tok["ar"] / sec["ar"], "dflash_tokens_per_s": tok["dflash"] / sec["dflash"],
             "speedup": (tok["dflash"] / sec["dflash"]) / (tok["ar"] / sec["ar"]),
             "tau": sum(r["dflash"]["after_prefill"] for r in mine) / ver if ver else None,
             "exact_ar": sum(r["ar"]["exact"] * r["n"] for r in mine) / sum(r["n"] for r in mine),
             "exact_dflash": sum(r["dflash"]["exact"] * r["n"] for r in mine) / sum(r["n"] for r in mine)}
        totals.append(t)
        print(f"b{batch} all      exact AR {100 * t['exact_ar']:5.1f}% DFlash {100 * t['exact_dflash']:5.1f}%  identical "
              f"{t['identical']}/{t['examples']}  tau {t['tau'] or 0:4.2f}  {t['ar_tokens_per_s']:7.1f} -> "
              f"{t['dflash_tokens_per_s']:7.1f} tok/s  x{t['speedup']:.2f}")
    write_json_atomic(a.out, {"context": context(), "model": str(ar.path), "draft": str(spec.draft_path),
                              "drafter": spec.drafter.config.__dict__, "params": params.__dict__,
                              "split": "report (held-out examples 250..)", "timer_includes": TIMER_INCLUDES,
                              "repeats": a.repeats, "date": time.strftime("%Y-%m-%d"), "rows": rows, "totals": totals})
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
