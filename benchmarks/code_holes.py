"""Holes of unknown length on `default-code` (issue 47): held-out single-line and multi-line holes
(unmask.train.code.hole_examples, the `test` split: files never trained on) decoded with the true
length, with only a bound (`hole_length` "bound", the default: 24 tokens single-line, 64
multi-line) and with that fixed length (`hole_length` "exact"), one token per forward, no cache,
greedy, paired; beside them the autoregressive twin laid out prefix-suffix-middle (it writes the
middle and its end of text, up to the bound). Exact match (the hidden text, character for character) and edit similarity
(difflib's ratio) of the whole middle; forwards and seconds per hole (every forward and the loop,
not tokenisation), batch 8, float32, this CPU. `default-code` was trained on exact-length spans
(never padded): a bounded hole ends only where its text goes on with the suffix's own text. A
model trained with DreamOn's expand token (`unmask train --span-expand`) also decodes each hole
growing (`hole_length` "grow": from 4 masks, up to the bound).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/code_holes.py   # -> benchmarks/results/code_holes.json
"""

import argparse
import difflib
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from unmask import LLM  # noqa: E402
from unmask.bench.runner import TIMER_INCLUDES, context  # noqa: E402
from unmask.bench.stats import paired_bootstrap, wilson_interval  # noqa: E402
from unmask.files import write_json_atomic  # noqa: E402
from unmask.train.code import hole_examples  # noqa: E402

BOUNDS = {"single": 24, "multi": 64}


def run(llm: LLM, exs: list[dict], length, hole_length: str, batch: int, ar: bool = False, **given) -> dict:
    """Every hole decoded (`length`: its gen_length, a function of the hole) in batches, at one
    token per forward with no cache unless `given` says otherwise (the AR twin: its defaults)."""
    outs, forwards, computed, seconds = [], 0, 0, 0.0
    for i in range(0, len(exs), batch):
        part = exs[i : i + batch]
        params = [llm.default_params(gen_length=length(e)) if ar else
                  llm.default_params(gen_length=length(e), block_length=length(e), steps=length(e),
                                     hole_length=hole_length, **{"policy": "fixed", "cache": "none", **given})
                  for e in part]
        t = time.perf_counter()
        out = llm._generate_engine(llm.encode([e["prefix"] for e in part], chat=False), params,
                                   [llm.tokenizer.encode(e["suffix"], add_special_tokens=False) for e in part])
        seconds += time.perf_counter() - t
        outs += [r.text for r in out.results]
        forwards += sum(r.nfe for r in out.results)
        computed += sum(rec.rows for rec in out.steps if rec.kind != "draft")  # every row of every forward
    flags = [o == e["middle"] for o, e in zip(outs, exs)]
    sims = [difflib.SequenceMatcher(None, o, e["middle"], autojunk=False).ratio() for o, e in zip(outs, exs)]
    return {"exact": sum(flags), "of": len(exs), "exact_ci95": wilson_interval(sum(flags), len(exs)),
            "similarity": sum(sims) / len(sims), "sims": sims, "forwards_per_hole": forwards / len(exs),
            "row_forwards_per_hole": computed / len(exs), "seconds_per_hole": seconds / len(exs),
            "samples": [{"want": e["middle"], "got": o} for e, o in list(zip(exs, outs))[:4]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--model", default="default-code", help="the diffusion code model (a name or folder)")
    ap.add_argument("--ar", default="default-code-ar", help="its prefix-suffix-middle twin ('' to skip)")
    ap.add_argument("--only", default="true,grow,bound,fixed", help="which rows (comma-separated)")
    ap.add_argument("--split", default="test", help="the held-out split the holes come from (select: to choose)")
    ap.add_argument("--out", default="benchmarks/results/code_holes.json")
    a = ap.parse_args()
    llm = LLM(a.model)
    twin = LLM(a.ar) if a.ar else None
    rows = {}
    for kind, bound in BOUNDS.items():
        exs = hole_examples(llm.tokenizer, a.split, kind, a.n)
        only = set(a.only.split(","))
        true = run(llm, exs, lambda e: e["middle_tokens"], "exact", a.batch)
        rows[f"{kind}: true length"] = true
        modes = [(f"{kind}: bound {bound}", "bound", "bound"), (f"{kind}: fixed {bound}", "exact", "fixed")]
        if llm.token_ids.expand is not None:  # a model trained with DreamOn's expand token
            modes.insert(0, (f"{kind}: grow to {bound}", "grow", "grow"))
        for name, mode, key in modes:
            if key not in only:
                continue
            r = run(llm, exs, lambda e: bound, mode, a.batch)
            r["similarity_vs_true"] = paired_bootstrap(r["sims"], true["sims"])
            rows[name] = r
        if twin is not None:  # the AR twin writes the middle and its end of text, up to the bound
            r = run(twin, exs, lambda e: bound, "bound", a.batch, ar=True)
            r["similarity_vs_true"] = paired_bootstrap(r["sims"], true["sims"])
            rows[f"{kind}: AR twin, up to {bound}"] = r
        for name in [n for n in rows if n.startswith(f"{kind}:")]:
            r = rows[name]
            print(f"{name:22s} exact {r['exact']:2d}/{r['of']}  similarity {r['similarity']:.3f}  "
                  f"{r['forwards_per_hole']:.1f} forwards/hole  {1000 * r['seconds_per_hole']:.0f} ms/hole")
    write_json_atomic(a.out, {"context": {**context(), "timer_includes": TIMER_INCLUDES, "batch": a.batch,
                                          "model": a.model, "split": a.split, "setup": __doc__.split("\n\n")[0]},
                          "rows": rows})


if __name__ == "__main__":
    main()
