"""The AR twin offline: the request engine against the dedicated lockstep KV-cache loop it used
to have (now tests/reference.py's decode_ar), on the same prompts, per forward. Issue 20 kept
the dedicated loop only if the engine stayed more than 10 % slower per forward; it did not, and
the loop was removed from the package. Both give the same tokens.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/ar_offline.py [--n 50] [--repeats 3]

Prompts: the first N held-out examples of each task (selection split), gen 24, greedy, float32.
Timing: the decode of each batch (every forward and the loop), tokenisation excluded, best of
`--repeats` interleaved runs. Writes benchmarks/results/ar_offline.json.
"""

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from unmask import LLM  # noqa: E402
from unmask.bench.runner import context  # noqa: E402
sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from reference import decode_ar  # noqa: E402
from unmask.files import write_json_atomic  # noqa: E402
from unmask.tasks import TASKS, split_examples  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/ar_offline.json")
    a = ap.parse_args()
    ar = LLM("default-ar")
    params = ar.default_params(gen_length=24)
    prompts = ar.encode([ex.prompt for t in TASKS for ex in split_examples(t, "selection", a.n)], chat=False)
    rows = []
    for batch in map(int, a.batches.split(",")):
        chunks = [prompts[i : i + batch] for i in range(0, len(prompts), batch)]
        best = {"engine": float("inf"), "loop": float("inf")}
        forwards = {}
        for _ in range(a.repeats):
            for how in ("engine", "loop"):
                t, nfe, out = 0.0, 0, []
                for c in chunks:
                    t0 = time.perf_counter()
                    if how == "engine":
                        o = ar.generate(c, params)
                        out += [r.raw_ids for r in o.results]
                        nfe += o.nfe
                    else:
                        d = decode_ar(ar.model, ar.token_ids, c, 24)
                        out += d.rows
                        nfe += d.nfe
                    t += time.perf_counter() - t0
                best[how] = min(best[how], t)
                forwards[how] = (nfe, out)
        same = forwards["engine"][1] == forwards["loop"][1]
        per = {h: 1e3 * best[h] / forwards[h][0] for h in best}
        rows.append({"batch": batch, "requests": len(prompts), "same_tokens": same,
                     "forwards": {h: forwards[h][0] for h in best}, "seconds": best,
                     "ms_per_forward": per, "engine_vs_loop": per["engine"] / per["loop"]})
        print(f"batch {batch}: engine {per['engine']:.2f} ms/forward, loop {per['loop']:.2f} ms/forward "
              f"({per['engine'] / per['loop']:.2f}x), same tokens: {same}")
    write_json_atomic(Path(a.out), {"benchmark": "ar_offline", "context": context(), "n_per_task": a.n,
                                    "results": rows})
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
