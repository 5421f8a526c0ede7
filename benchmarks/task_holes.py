"""Holes of unknown length on the embedded task model (issue 47): the same held-out holes decoded
with the true length, with only a bound (`hole_length` "bound", the default: `max_tokens` 8), and
with a fixed length of 8 (`hole_length` "exact"), and decoded at every length up to 8 with the
fill they agree on kept (`hole_length` "consensus", engine/consensus.py), at one token per forward
and at the fast defaults (threshold 0.9, DualCache), paired, with intervals.

Holes: per task, the `report` split's examples (never used to choose the method: it was chosen
on holes of the `selection` split), answers of 3 words or more; in each a span of 1-4 words with
at least one word on each side (seeded); the first 90 after a seeded shuffle. The prefix is the
prompt and the answer's words before the span, the suffix the words after it. Exact match: the
middle's text equals the span's. Also: forwards and seconds per hole (every forward and the loop;
tokenisation excluded), batch 8, float32, this CPU.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/task_holes.py   # -> benchmarks/results/task_holes.json
"""

import argparse
import dataclasses
import os
import random
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from unmask import LLM  # noqa: E402
from unmask.bench.runner import TIMER_INCLUDES, context  # noqa: E402
from unmask.bench.stats import paired_bootstrap, wilson_interval  # noqa: E402
from unmask.files import write_json_atomic  # noqa: E402
from unmask.tasks import TASKS, split_examples  # noqa: E402

BOUND = 8


def holes(split: str, n: int, seed: int = 0) -> list[dict]:
    rng, out = random.Random(seed), []
    for task in TASKS:
        for ex in split_examples(task, split, 40):
            w = ex.answer.split()
            if len(w) < 3:
                continue
            k = rng.randint(1, min(4, len(w) - 2))
            i = rng.randint(1, len(w) - 1 - k)
            out.append({"task": task, "prefix": ex.prompt + " " + " ".join(w[:i]), "middle": " ".join(w[i:i + k]),
                        "suffix": " " + " ".join(w[i + k:])})
    rng.shuffle(out)
    return out[:n]


def run(llm: LLM, hs: list[dict], length, schedule: str, hole_length: str, batch: int) -> dict:
    """Decode every hole (`length`: the hole's gen_length, a function of the hole) in batches."""
    right, forwards, seconds = [], 0, 0.0
    for i in range(0, len(hs), batch):
        part = hs[i : i + batch]
        for h in part:  # one request per hole (lengths differ), all in one engine batch
            h["_len"] = length(h)
        given = dict(hole_length=hole_length)
        if schedule == "one":
            given.update(policy="fixed", cache="none")
        params = [llm.default_params(gen_length=h["_len"], block_length=h["_len"],
                                     **(dict(steps=h["_len"]) if schedule == "one" else {}), **given) for h in part]
        t = time.perf_counter()
        out = llm._generate_engine(llm.encode([h["prefix"] for h in part], chat=False), params,
                                   [llm.tokenizer.encode(h["suffix"], add_special_tokens=False) for h in part])
        seconds += time.perf_counter() - t
        for h, r in zip(part, out.results):
            right.append(r.text.strip() == h["middle"])
            forwards += r.nfe
    k = sum(right)
    return {"exact": k, "of": len(hs), "rate": k / len(hs), "interval": wilson_interval(k, len(hs)),
            "forwards_per_hole": forwards / len(hs), "seconds_per_hole": seconds / len(hs), "flags": right}


def two_holes(split: str, n: int, seed: int = 1) -> list[dict]:
    """Templates of two holes in one answer (1-2 words each, a word or more before, between and
    after them)."""
    rng, out = random.Random(seed), []
    for task in TASKS:
        for ex in split_examples(task, split, 40):
            w = ex.answer.split()
            if len(w) < 5:
                continue
            k1, k2 = rng.randint(1, 2), rng.randint(1, 2)
            if len(w) < k1 + k2 + 3:
                continue
            i = rng.randint(1, len(w) - k1 - k2 - 2)
            j = rng.randint(i + k1 + 1, len(w) - k2 - 1)
            out.append({"task": task, "pieces": [ex.prompt + " " + " ".join(w[:i]), " " + " ".join(w[i + k1:j]),
                                                 " " + " ".join(w[j + k2:])],
                        "middles": [" ".join(w[i:i + k1]), " ".join(w[j:j + k2])]})
    rng.shuffle(out)
    return out[:n]


def run_templates(llm: LLM, ts: list[dict], length, hole_length: str, batch: int) -> dict:
    """Decode every two-hole template through LLM.infill (`length`: a hole's marker length, a
    function of its middle) at one token per forward over the hole positions."""
    right, holes_right, forwards, seconds = [], 0, 0, 0.0
    params = llm.default_params(hole_length=hole_length, policy="fixed", cache="none")
    params = dataclasses.replace(params, steps=params.gen_length)  # one token per forward
    for i in range(0, len(ts), batch):
        part = ts[i : i + batch]
        texts = ["".join(p + f"<|hole:{length(m)}|>" for p, m in zip(t["pieces"], t["middles"])) + t["pieces"][-1]
                 for t in part]
        t0 = time.perf_counter()
        out = llm.infill(texts, params)
        seconds += time.perf_counter() - t0
        for t, r in zip(part, out.results):
            ok = [h.strip() == m for h, m in zip(r.holes, t["middles"])]
            holes_right += sum(ok)
            right.append(all(ok))
            forwards += r.nfe
    k = sum(right)
    return {"exact": k, "of": len(ts), "rate": k / len(ts), "interval": wilson_interval(k, len(ts)),
            "holes_exact": holes_right, "holes": 2 * len(ts), "forwards_per_template": forwards / len(ts),
            "seconds_per_template": seconds / len(ts), "flags": right}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", default="report")
    ap.add_argument("--n", type=int, default=90)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--templates", type=int, default=60, help="two-hole templates (0: none)")
    ap.add_argument("--out", default="benchmarks/results/task_holes.json")
    a = ap.parse_args()
    llm = LLM("default")
    hs = holes(a.split, a.n)
    true_len = lambda h: len(llm.tokenizer.encode(" " + h["middle"], add_special_tokens=False))  # noqa: E731
    rows = {}
    for schedule in ("one", "fast"):
        rows[f"true length ({schedule})"] = run(llm, hs, true_len, schedule, "exact", a.batch)
        rows[f"bound {BOUND} ({schedule})"] = run(llm, hs, lambda h: BOUND, schedule, "bound", a.batch)
        rows[f"fixed {BOUND} ({schedule})"] = run(llm, hs, lambda h: BOUND, schedule, "exact", a.batch)
        rows[f"consensus {BOUND} ({schedule})"] = run(llm, hs, lambda h: BOUND, schedule, "consensus", a.batch)
        for name in (f"bound {BOUND} ({schedule})", f"fixed {BOUND} ({schedule})", f"consensus {BOUND} ({schedule})"):
            rows[name]["vs_true"] = paired_bootstrap(rows[name]["flags"], rows[f"true length ({schedule})"]["flags"])
        for name, r in rows.items():
            if name.endswith(f"({schedule})"):
                print(f"{name:24s} {r['exact']:3d}/{r['of']}  [{r['interval'][0]:.2f}, {r['interval'][1]:.2f}]  "
                      f"{r['forwards_per_hole']:.2f} forwards/hole  {1000 * r['seconds_per_hole']:.1f} ms/hole")
    if a.templates:
        ts = two_holes(a.split, a.templates)
        true_t = lambda m: len(llm.tokenizer.encode(" " + m, add_special_tokens=False))  # noqa: E731
        for name, length, mode in (("templates: true length", true_t, "exact"),
                                   (f"templates: bound {BOUND}", lambda m: BOUND, "bound"),
                                   (f"templates: fixed {BOUND}", lambda m: BOUND, "exact"),
                                   (f"templates: consensus {BOUND}", lambda m: BOUND, "consensus")):
            rows[name] = run_templates(llm, ts, length, mode, a.batch)
        for name in (f"templates: bound {BOUND}", f"templates: fixed {BOUND}", f"templates: consensus {BOUND}"):
            rows[name]["vs_true"] = paired_bootstrap(rows[name]["flags"], rows["templates: true length"]["flags"])
        for name, r in rows.items():
            if name.startswith("templates"):
                print(f"{name:24s} {r['exact']:3d}/{r['of']} both holes ({r['holes_exact']}/{r['holes']} holes)  "
                      f"[{r['interval'][0]:.2f}, {r['interval'][1]:.2f}]  {r['forwards_per_template']:.2f} forwards  "
                      f"{1000 * r['seconds_per_template']:.1f} ms/template")
    write_json_atomic(a.out, {"context": {**context(), "timer_includes": TIMER_INCLUDES, "batch": a.batch,
                                          "split": a.split, "bound": BOUND, "setup": __doc__.split("\n\n")[1]},
                              "holes": [{k: v for k, v in h.items() if not k.startswith("_")} for h in hs],
                              "rows": rows})


if __name__ == "__main__":
    main()
