"""A code hole of unknown length decoded at several lengths, keeping the fill most similar to the
others (minimum Bayes risk over lengths; training-free, issue 47), on `default-code`: held-out
single-line and multi-line holes (unmask.train.code.hole_examples; `test` by default, the holes of
benchmarks/code_holes.py), one token per forward, no cache, greedy, batch 8, float32, this CPU;
beside the true length and the bound (`hole_length` "bound"). Lengths: 1..24 single-line, 4..64
by 4 multi-line (chosen on the `select` split). Edit similarity (difflib's ratio) of the whole
middle; paired bootstrap against the true length; forwards and seconds per hole (every forward
and the loop, not tokenisation).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/code_hole_mbr.py   # -> benchmarks/results/code_hole_mbr.json
"""

import argparse
import difflib
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from unmask import LLM  # noqa: E402
from unmask.bench.runner import context  # noqa: E402
from unmask.bench.stats import paired_bootstrap  # noqa: E402
from unmask.files import write_json_atomic  # noqa: E402
from unmask.train.code import hole_examples  # noqa: E402

from code_holes import run  # noqa: E402  (benchmarks/, beside this script)

LENGTHS = {"single": list(range(1, 25)), "multi": list(range(4, 65, 4))}


def similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def fills_at(llm: LLM, exs: list[dict], length: int, batch: int) -> tuple[list[str], int]:
    """Every hole's fill at exactly `length` tokens, and the forwards they took."""
    out, forwards = [], 0
    for i in range(0, len(exs), batch):
        part = exs[i : i + batch]
        params = [llm.default_params(gen_length=length, block_length=length, steps=length, policy="fixed",
                                     cache="none", hole_length="exact")] * len(part)
        o = llm._generate_engine(llm.encode([e["prefix"] for e in part], chat=False), params,
                                 [llm.tokenizer.encode(e["suffix"], add_special_tokens=False) for e in part])
        out += [r.text for r in o.results]
        forwards += sum(r.nfe for r in o.results)
    return out, forwards


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", default="test")
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--out", default="benchmarks/results/code_hole_mbr.json")
    a = ap.parse_args()
    llm = LLM("default-code")
    res = {"benchmark": "code_hole_mbr", "context": {**context(), "split": a.split, "setup": __doc__.split("\n\n")[0]}}
    for kind, lengths in LENGTHS.items():
        exs = hole_examples(llm.tokenizer, a.split, kind, a.n)
        t0, fills, forwards = time.perf_counter(), {}, 0
        for L in lengths:
            fills[L], f = fills_at(llm, exs, L, a.batch)
            forwards += f
        seconds = time.perf_counter() - t0
        mbr = []
        for j, e in enumerate(exs):
            cand = [fills[L][j] for L in lengths]
            best = max(cand, key=lambda f: sum(similarity(f, g) for g in cand))
            mbr.append(similarity(best, e["middle"]))
        true = run(llm, exs, lambda e: e["middle_tokens"], "exact", a.batch)
        bound = run(llm, exs, lambda e: lengths[-1], "bound", a.batch)
        res[kind] = {"holes": len(exs), "lengths": [lengths[0], lengths[-1], lengths[1] - lengths[0]],
                     "true": true["similarity"], "bound": bound["similarity"], "mbr": sum(mbr) / len(mbr),
                     "mbr_minus_true": paired_bootstrap(mbr, true["sims"]),
                     "bound_minus_true": paired_bootstrap(bound["sims"], true["sims"]),
                     "mbr_forwards_per_hole": forwards / len(exs), "mbr_seconds_per_hole": seconds / len(exs),
                     "true_forwards_per_hole": true["forwards_per_hole"]}
        print(kind, res[kind], flush=True)
    write_json_atomic(a.out, res)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
