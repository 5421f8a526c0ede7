"""Where does a bounded code hole end? (issue 47, training-free, on `default-code`.)

`default-code` fills every mask of a bounded hole with code (it was never trained to end a span),
so the bound's text runs on past the middle. Its holes are whole lines, and the text it writes
is lines, so the question is how many of the fill's lines to keep. This measures, on the
`select` split (files never trained on, used to choose; nothing is chosen on `test`), the cut
rules one could ship beside the true length and the uncut bound:

- `first line`: keep one line (a prior that every hole is one line, not a method);
- `suffix likelihood`: keep the cut after which the suffix's first 16 tokens, masked together,
  are most likely under the model (one forward per candidate cut; the signal of CAL / "does the
  suffix follow", at line granularity);
- `suffix likelihood, no whitespace`: the same, leaving indentation tokens out of the mean;
- `fuzzy suffix`: cut before the fill line most similar to the suffix's first line (ratio > 0.6;
  the suffix-overlap rule of `sampler/stops.py`, loosened to similar lines);
- `indentation`: cut before the first fill line indented less than the suffix's first line;
- `oracle`: the best cut for the hidden text (what a perfect rule would reach).

Edit similarity (difflib's ratio) of the middle; one token per forward, no cache, greedy.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/code_hole_cuts.py   # -> benchmarks/results/code_hole_cuts.json
"""

import argparse
import difflib
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from unmask import LLM  # noqa: E402
from unmask.bench.runner import context  # noqa: E402
from unmask.files import write_json_atomic  # noqa: E402
from unmask.train.code import hole_examples  # noqa: E402

BOUNDS = {"single": 24, "multi": 64}
SUFFIX_TOKENS = 16


def similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def decode(llm: LLM, exs: list[dict], length, hole_length: str, batch: int) -> list[str]:
    outs = []
    for i in range(0, len(exs), batch):
        part = exs[i : i + batch]
        params = [llm.default_params(gen_length=length(e), block_length=length(e), steps=length(e), policy="fixed",
                                     cache="none", hole_length=hole_length) for e in part]
        out = llm._generate_engine(llm.encode([e["prefix"] for e in part], chat=False), params,
                                   [llm.tokenizer.encode(e["suffix"], add_special_tokens=False) for e in part])
        outs += [r.text for r in out.results]
    return outs


@torch.no_grad()
def suffix_scores(llm: LLM, prefix: str, cuts: list[str], suffix: str) -> list[tuple[list[float], list[str]]]:
    """Per cut: the log-probabilities of the suffix's first tokens, masked together, and those tokens."""
    tok, out = llm.tokenizer, []
    p = llm.encode([prefix], chat=False)[0]
    s = tok.encode(suffix, add_special_tokens=False)
    n = min(SUFFIX_TOKENS, len(s))
    for cut in cuts:
        ids = torch.tensor([list(p) + tok.encode(cut, add_special_tokens=False) + s])
        start = ids.shape[1] - len(s)
        x = ids.clone()
        x[0, start : start + n] = llm.token_ids.mask
        logp = llm.model(x, torch.arange(x.shape[1])[None]).log_softmax(-1)[0, start : start + n]
        out.append((logp.gather(-1, ids[0, start : start + n, None])[:, 0].tolist(), [tok.decode([t]) for t in s[:n]]))
    return out


def indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def choose(rule: str, fill: str, suffix: str, scores) -> int:
    """The index of the kept cut (cut k keeps the fill's first k + 1 lines)."""
    lines, first = fill.splitlines(), (suffix.splitlines() or [""])[0]
    last = max(len(lines), 1) - 1
    if rule == "first line":
        return 0
    if rule.startswith("suffix likelihood"):
        def mean(sc, toks):
            kept = [v for v, t in zip(sc, toks) if t.strip()] if rule.endswith("no whitespace") else sc
            return sum(kept or sc) / len(kept or sc)
        return max(range(len(scores)), key=lambda k: mean(*scores[k]))
    if rule == "fuzzy suffix":
        ratios = [(similarity(lines[k], first), k - 1) for k in range(1, len(lines))]
        best = max(ratios, default=(0.0, last))
        return best[1] if best[0] > 0.6 else last
    if rule == "indentation":
        return next((k - 1 for k in range(1, len(lines)) if lines[k].strip() and indent(lines[k]) < indent(first)), last)
    raise ValueError(rule)


RULES = ("first line", "suffix likelihood", "suffix likelihood, no whitespace", "fuzzy suffix", "indentation")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--split", default="select")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--model", default="default-code")
    ap.add_argument("--out", default="benchmarks/results/code_hole_cuts.json")
    a = ap.parse_args()
    llm = LLM(a.model)
    rows = {}
    for kind, bound in BOUNDS.items():
        exs = hole_examples(llm.tokenizer, a.split, kind, a.n)
        true = decode(llm, exs, lambda e: e["middle_tokens"], "exact", a.batch)
        fills = decode(llm, exs, lambda e: bound, "bound", a.batch)
        sims: dict[str, list[float]] = {"true length": [], f"bound {bound}, uncut": [], "oracle cut": []}
        sims.update({r: [] for r in RULES})
        for e, t, fill in zip(exs, true, fills):
            lines = fill.splitlines(keepends=True)
            cuts = ["".join(lines[: k + 1]).rstrip("\n") + "\n" for k in range(len(lines))] or ["\n"]
            scores = suffix_scores(llm, e["prefix"], cuts, e["suffix"])
            sims["true length"].append(similarity(t, e["middle"]))
            sims[f"bound {bound}, uncut"].append(similarity(fill, e["middle"]))
            sims["oracle cut"].append(max(similarity(c, e["middle"]) for c in cuts))
            for r in RULES:
                sims[r].append(similarity(cuts[min(choose(r, fill, e["suffix"], scores), len(cuts) - 1)], e["middle"]))
        for name, v in sims.items():
            rows[f"{kind}: {name}"] = {"similarity": sum(v) / len(v), "of": len(v)}
            print(f"{kind:6s} {name:34s} similarity {sum(v) / len(v):.3f}")
    write_json_atomic(a.out, {"context": {**context(), "split": a.split, "model": a.model,
                                          "setup": __doc__.split("\n\n")[0]}, "rows": rows})


if __name__ == "__main__":
    main()
