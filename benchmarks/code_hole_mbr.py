"""A code hole of unknown length decoded at several lengths, the fill most like the others kept
(`hole_length` "consensus", engine/consensus.py: minimum Bayes risk over lengths, training-free,
issue 47), on `default-code`: held-out single-line and multi-line holes
(unmask.train.code.hole_examples; `test` by default, the holes of benchmarks/code_holes.py),
greedy, batch 8 holes (each consensus hole is `hole_candidates` rows of the batch), float32, this
CPU; beside the true length (`exact`) and the bound alone (`bound`), at one token per forward with
no cache and at the model's fast setting (threshold 0.3, DualCache). Bounds 24 single-line, 64
multi-line. Edit similarity (difflib's ratio) of the whole middle; paired bootstrap against the
true length; per hole: the forwards the request waited for (its candidates run in the same
batched forwards), the candidates' forwards summed (the compute), seconds (every forward and the
loop, not tokenisation).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/code_hole_mbr.py   # -> benchmarks/results/code_hole_mbr.json
"""

import argparse
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from unmask import LLM  # noqa: E402
from unmask.bench.runner import TIMER_INCLUDES, context  # noqa: E402
from unmask.bench.stats import paired_bootstrap  # noqa: E402
from unmask.files import write_json_atomic  # noqa: E402
from unmask.train.code import hole_examples  # noqa: E402

from code_holes import run  # noqa: E402  (benchmarks/, beside this script)

BOUNDS = {"single": 24, "multi": 64}
SETTINGS = {"one token per forward": dict(policy="fixed", cache="none"),
            "threshold 0.3 + DualCache": dict(policy="threshold", threshold=0.3, cache="dual")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", default="test")
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--candidates", type=int, default=None, help="hole_candidates (default: the parameter's)")
    ap.add_argument("--out", default="benchmarks/results/code_hole_mbr.json")
    a = ap.parse_args()
    llm = LLM("default-code")
    extra = {} if a.candidates is None else {"hole_candidates": a.candidates}
    res = {"benchmark": "code_hole_mbr", "context": {**context(), "timer_includes": TIMER_INCLUDES, "split": a.split,
                                                     "batch_holes": a.batch, "setup": __doc__.split("\n\n")[0]}}
    for kind, bound in BOUNDS.items():
        exs = hole_examples(llm.tokenizer, a.split, kind, a.n)
        for name, setting in SETTINGS.items():
            true = run(llm, exs, lambda e: e["middle_tokens"], "exact", a.batch, **setting)
            rows = {"true length": true}
            for mode in ("consensus", "bound"):
                r = run(llm, exs, lambda e: bound, mode, a.batch, **setting, **(extra if mode == "consensus" else {}))
                r["similarity_vs_true"] = paired_bootstrap(r["sims"], true["sims"])
                rows[f"{mode} {bound}"] = r
            res[f"{kind}, {name}"] = rows
            for row, r in rows.items():
                print(f"{kind:6s} {name:26s} {row:14s} similarity {r['similarity']:.3f} "
                      f"{r.get('similarity_vs_true', '')}  forwards/hole {r['forwards_per_hole']:.1f} "
                      f"(rows {r['row_forwards_per_hole']:.1f})  {1000 * r['seconds_per_hole']:.0f} ms/hole",
                      flush=True)
    write_json_atomic(a.out, res)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
