"""Structured output on the embedded models: quality and speed with and without a constraint,
at the default threshold and at aggressive settings, and what the grammar costs.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/structured_output.py [--n 200] [--out benchmarks/results/structured_output.json]

Tasks (the held-out "report" split: nothing here was chosen on it):
- json: render a record as the embedded vocabulary writes JSON ({ "name" : "ann" , "age" : 4 2 });
  the constraint is the regex of that format (any keys and values of its shape, not the answer);
  exact = the gold text; valid = in the format;
- pairs: one of two phrases ("full house" or "high card"; a mixture such as "high house" is
  invalid): the constraint is the choice of the two; exact = valid = one of them.
Settings: the model's default (threshold 0.9, dual cache), threshold 0.5 and 0.3, and the fixed
schedule at 2 and 4 tokens per forward; each unconstrained and constrained, on the same examples
(paired: the constrained minus unconstrained difference with a bootstrap interval). Models: the
masked default, the block model (its exact cache) and the autoregressive twin (one token per
forward; the constraint only).
Code (`--code`, default-code on held-out Python, unmask/train/code.py's test split): given the
text before a hidden line, write the line; the constraint is one line (`[^\n]*\n`), the
unconstrained output is cut at its first line; exact = the hidden line, similarity = difflib's
ratio; the model's fast setting (threshold 0.3, dual cache) and one token per forward; time per
answer (decode seconds / answers at batch 8: the two write different amounts of text, so tokens/s
does not compare them). Timing: the decode of all examples on one engine (max_num_seqs
= batch; every forward and the loop, tokenisation excluded), float32, this CPU; grammar time =
the constrained rows' masks and checks (engine/constrained.py before/after, inside the decode),
per forward call and per committed token, at batch 1 and 8; setup = add_request's compile and
first plan per request (outside the decode time). Writes JSON."""

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from unmask import LLM  # noqa: E402
from unmask.bench.runner import TIMER_INCLUDES, context  # noqa: E402
from unmask.bench.stats import paired_bootstrap, wilson_interval  # noqa: E402
from unmask.constrain import Constraint  # noqa: E402
from unmask.engine import EngineConfig  # noqa: E402
from unmask.files import write_json_atomic  # noqa: E402
from unmask.tasks import split_examples  # noqa: E402

VALUE = r'("[a-z]+"|[0-9]( [0-9])*)'
JSON_FORMAT = Constraint.regex(r'\{ "[a-z]+" : ' + VALUE + r'( , "[a-z]+" : ' + VALUE + r')* \}')


def settings_for(llm: LLM) -> dict:
    g = llm.default_params().gen_length
    if llm.arch.causal:
        return {"autoregressive": {}}
    return {"default (threshold 0.9)": {}, "threshold 0.5": dict(policy="threshold", threshold=0.5),
            "threshold 0.3": dict(policy="threshold", threshold=0.3),
            "fixed 2/forward": dict(policy="fixed", steps=g // 2), "fixed 4/forward": dict(policy="fixed", steps=g // 4)}


class GrammarClock:
    """Time spent in the masked kind's constrained rows (masks before, checks after each forward)."""

    def __init__(self, engine) -> None:
        self.seconds, self.calls = 0.0, 0
        c = getattr(engine.kind, "constrained", None)
        if c is None:
            return
        for name in ("before", "after"):
            fn = getattr(c, name)

            def timed(*a, _fn=fn, **kw):
                t0 = time.perf_counter()
                try:
                    return _fn(*a, **kw)
                finally:
                    self.seconds += time.perf_counter() - t0
                    self.calls += 1

            setattr(c, name, timed)


def run(llm: LLM, examples, params, constraints, batch: int) -> dict:
    engine = llm.engine(EngineConfig(max_num_seqs=batch, trace_limit=None))
    clock = GrammarClock(engine)
    ids = [llm.encode([ex.prompt], chat=False)[0] for ex in examples]
    t0 = time.perf_counter()  # the grammar's setup (compile, first plan) as requests are added
    reqs = [engine.add_request(p, params, constraint=c) for p, c in zip(ids, constraints)]
    setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    seconds = time.perf_counter() - t0
    results = [llm.result_of(q.canvas, q.nfe, q.commits, q.finished - t0) for q in reqs]
    tokens = sum(r.num_tokens for r in results)
    forwards = len(engine.trace)
    return {"results": results, "seconds": seconds, "tokens": tokens, "forward_calls": forwards,
            "grammar_seconds": clock.seconds, "setup_seconds": setup}


def measure(llm: LLM, task: str, examples, setting: dict, constrained: bool, batch: int) -> dict:
    params = llm.default_params(**setting)
    if task == "json":
        cons = [JSON_FORMAT if constrained else None] * len(examples)
        valid = lambda ex, text: JSON_FORMAT.matches(text)  # noqa: E731
    else:
        cons = [Constraint.choice(list(ex.valid)) if constrained else None for ex in examples]
        valid = lambda ex, text: text in ex.valid  # noqa: E731
    got = run(llm, examples, params, cons, batch)
    res = got["results"]
    exact = [r.text == ex.answer or (task == "pairs" and r.text in ex.valid) for ex, r in zip(examples, res)]
    ok = [valid(ex, r.text) for ex, r in zip(examples, res)]
    n = len(examples)
    return {"exact": sum(exact) / n, "exact_ci": wilson_interval(sum(exact), n), "valid": sum(ok) / n,
            "valid_ci": wilson_interval(sum(ok), n), "forwards_per_answer": sum(r.nfe for r in res) / n,
            "tokens_per_forward": got["tokens"] / max(sum(r.nfe for r in res), 1),
            "tokens_per_s": got["tokens"] / got["seconds"], "seconds": got["seconds"],
            "grammar_share": got["grammar_seconds"] / got["seconds"],
            "grammar_ms_per_forward_call": 1e3 * got["grammar_seconds"] / max(got["forward_calls"], 1),
            "grammar_us_per_token": 1e6 * got["grammar_seconds"] / max(got["tokens"], 1),
            "setup_ms_per_request": 1e3 * got["setup_seconds"] / n,
            "_flags": exact, "_valid": ok,
            "grammar_forced": sum(r.grammar_forced for r in res), "grammar_rejected": sum(r.grammar_rejected for r in res)}


def code_rows(n: int) -> list[dict]:
    """default-code writing one held-out line, with and without the one-line constraint."""
    import difflib

    from unmask.train.code import hole_examples

    llm = LLM("default-code")
    exs = hole_examples(llm.tokenizer, "test", "single", n)
    line = Constraint.regex(r"[^\n]*\n")
    rows = []
    for label, setting in {"default (threshold 0.3)": dict(gen_length=32, block_length=32),
                           "1 token/forward": dict(gen_length=32, block_length=32, policy="fixed", steps=32,
                                                   cache="none")}.items():
        params = llm.default_params(**setting)
        flags = {}
        for kind in ("unconstrained", "constrained"):
            engine = llm.engine(EngineConfig(max_num_seqs=8, max_waiting=len(exs) + 1, trace_limit=None))
            ids = [llm.encode([e["prefix"]], chat=False)[0] for e in exs]
            reqs = [engine.add_request(p, params, constraint=line if kind == "constrained" else None) for p in ids]
            t0 = time.perf_counter()
            while engine.has_unfinished():
                engine.step()
            seconds = time.perf_counter() - t0
            res = [llm.result_of(q.canvas, q.nfe, q.commits, 0.0) for q in reqs]
            outs = [r.text.split("\n")[0] + "\n" if "\n" in r.text else r.text for r in res]
            exact = [o == e["middle"] for o, e in zip(outs, exs)]
            sims = [difflib.SequenceMatcher(None, o, e["middle"], autojunk=False).ratio() for o, e in zip(outs, exs)]
            flags[kind] = (exact, sims)
            tokens = sum(r.num_tokens for r in res)
            row = {"model": "default-code", "task": "next line", "setting": label, "constraint": kind, "batch": 8,
                   "n": len(exs), "exact": sum(exact) / len(exs), "exact_ci": wilson_interval(sum(exact), len(exs)),
                   "similarity": sum(sims) / len(sims), "forwards_per_answer": sum(r.nfe for r in res) / len(res),
                   "tokens_per_s": tokens / seconds, "ms_per_answer": 1e3 * seconds / len(exs), "seconds": seconds}
            if kind == "constrained":
                row["exact_minus_unconstrained"] = paired_bootstrap(exact, flags["unconstrained"][0])
                row["similarity_minus_unconstrained"] = paired_bootstrap(sims, flags["unconstrained"][1])
            rows.append(row)
            print(f"default-code   line   {label:24} {kind:13} exact {100 * row['exact']:5.1f}% "
                  f"sim {row['similarity']:.3f} fwd {row['forwards_per_answer']:5.2f} ms/answer {row['ms_per_answer']:6.1f}",
                  flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--models", default="default,default-block,default-ar")
    ap.add_argument("--out", default="benchmarks/results/structured_output.json")
    ap.add_argument("--code", type=int, default=60, help="held-out lines for default-code (0: none)")
    a = ap.parse_args()
    torch.set_num_threads(2)
    rows = []
    for name in [m for m in a.models.split(",") if m]:
        llm = LLM(name)
        for task in ("json", "pairs"):
            examples = split_examples(task, "report", a.n)
            for label, setting in settings_for(llm).items():
                plain = measure(llm, task, examples, setting, False, 8)
                held = measure(llm, task, examples, setting, True, 8)
                d, lo, hi = paired_bootstrap(held["_flags"], plain["_flags"])
                for kind, m in (("unconstrained", plain), ("constrained", held)):
                    row = {"model": name, "task": task, "setting": label, "constraint": kind, "batch": 8,
                           **{k: v for k, v in m.items() if not k.startswith("_")}}
                    if kind == "constrained":
                        row["exact_minus_unconstrained"] = (d, lo, hi)
                    rows.append(row)
                    print(f"{name:14} {task:6} {label:24} {kind:13} exact {100 * m['exact']:5.1f}% "
                          f"valid {100 * m['valid']:5.1f}% fwd {m['forwards_per_answer']:5.2f} "
                          f"tok/s {m['tokens_per_s']:7.1f} grammar {100 * m['grammar_share']:4.1f}%", flush=True)
        # the grammar's cost at batch 1 (the default setting, constrained json)
        one = measure(llm, "json", split_examples("json", "report", 40), {}, True, 1)
        rows.append({"model": name, "task": "json", "setting": "default", "constraint": "constrained", "batch": 1,
                     **{k: v for k, v in one.items() if not k.startswith("_")}})
        print(f"{name:14} json   batch 1 constrained: grammar {one['grammar_ms_per_forward_call']:.3f} ms per forward "
              f"call, {one['grammar_us_per_token']:.0f} us per token, {100 * one['grammar_share']:.1f}% of decode")
    if a.code:
        rows += code_rows(a.code)
    write_json_atomic(a.out, {"context": context(), "timer": TIMER_INCLUDES, "n": a.n, "split": "report",
                              "rows": rows})


if __name__ == "__main__":
    main()
