"""Quality of `--quantize int8` (or `--method int4`) against float32 on the embedded models, paired.

Each embedded model (the diffusion model, its block-diffusion sibling, the AR twin) decodes the
same held-out examples in float32 and quantized with its own default settings; per task: exact
match of each, the paired difference with a bootstrap 95% interval and McNemar's exact p, and how
many outputs are token for token the same. The examples are the "report" split (250-999 of each
task's held-out stream), which nothing in this project was chosen on.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/quantize_quality.py   # -> benchmarks/results/quantize_quality_cpu.json
    OMP_WAIT_POLICY=PASSIVE python benchmarks/quantize_quality.py --method int4   # -> ..._int4_cpu.json
"""

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from unmask import LLM  # noqa: E402
from unmask.bench.runner import context  # noqa: E402
from unmask.bench.stats import mcnemar_exact, paired_bootstrap  # noqa: E402
from unmask.evaluate import run_task  # noqa: E402
from unmask.files import write_json_atomic  # noqa: E402
from unmask.tasks import TASKS  # noqa: E402

MODELS = ("default", "default-block", "default-ar")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--n", type=int, default=200, help="examples per task")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--method", default="int8", choices=("int8", "int4"))
    ap.add_argument("--out", default=None, help="default: benchmarks/results/quantize_quality[_int4]_cpu.json")
    a = ap.parse_args()
    m = a.method
    a.out = a.out or f"benchmarks/results/quantize_quality{'' if m == 'int8' else '_' + m}_cpu.json"
    res = {"benchmark": "quantize_quality", "context": context(), "split": "report", "n_per_task": a.n,
           "batch": a.batch, "method": m, "models": {}}
    for name in a.models.split(","):
        runs = {}
        for q in (None, m):
            llm = LLM(name, quantize=q)
            params = llm.default_params()
            t = time.perf_counter()
            runs[q or "float32"] = {task: run_task(llm, task, a.n, params, a.batch, split="report") for task in TASKS}
            print(f"{name} {q or 'float32'}: {time.perf_counter() - t:.0f} s", flush=True)
        rows, worst = {}, 0.0
        for task in TASKS:
            f, i = runs["float32"][task], runs[m][task]
            same = sum(x.token_ids == y.token_ids for fo, io in zip(f.outputs, i.outputs)
                       for x, y in zip(fo.results, io.results))
            d, lo, hi = paired_bootstrap(i.flags, f.flags)
            rows[task] = {"float32": round(sum(f.flags) / len(f.flags), 4), m: round(sum(i.flags) / len(i.flags), 4),
                          "diff": round(d, 4), "ci95": [round(lo, 4), round(hi, 4)],
                          "mcnemar_p": round(mcnemar_exact(i.flags, f.flags), 4), "same_output": same,
                          "n": len(f.flags)}
            worst = min(worst, d)
            print(f"  {task:8} float32 {100 * rows[task]['float32']:5.1f}  {m} {100 * rows[task][m]:5.1f}  "
                  f"diff {100 * d:+5.1f} [{100 * lo:+5.1f}, {100 * hi:+5.1f}]  p {rows[task]['mcnemar_p']:.3f}  "
                  f"same output {same}/{len(f.flags)}", flush=True)
        flat_f = [x for task in TASKS for x in runs["float32"][task].flags]
        flat_i = [x for task in TASKS for x in runs[m][task].flags]
        d, lo, hi = paired_bootstrap(flat_i, flat_f)
        res["models"][name] = {"tasks": rows, "all": {"float32": round(sum(flat_f) / len(flat_f), 4),
                                                      m: round(sum(flat_i) / len(flat_i), 4), "diff": round(d, 4),
                                                      "ci95": [round(lo, 4), round(hi, 4)],
                                                      "mcnemar_p": round(mcnemar_exact(flat_i, flat_f), 4)},
                               "worst_task_diff": round(worst, 4),
                               "within_one_point_every_task": worst >= -0.01}
        print(f"{name}: all {100 * d:+.2f} points [{100 * lo:+.2f}, {100 * hi:+.2f}]; worst task {100 * worst:+.1f}")
    write_json_atomic(Path(a.out), res)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
