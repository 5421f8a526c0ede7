"""Does token editing pay? The edit policy (mask-to-token above `threshold`, token-to-token above
`edit_threshold`, `max_post_steps` editing steps after a block's last mask) against the threshold
policy with editing off, on the same held-out task examples, per task, with paired statistics.

Every setting decodes the same examples (a split of unmask.tasks.SPLITS): gen_length 24, the
model's blocks of 8, its exact block cache, greedy, batch 8. Reported per setting: exact match
(validity for pairs) per task and overall, forwards per request, tokens per forward, tokens/s
(decode wall time of `LLM.generate`, tokenisation excluded, on this CPU), edits per request. Each
editing setting is compared with editing off at the same threshold (paired bootstrap interval of
the difference, exact McNemar p), and with the fastest editing-off setting that takes at least as
many forwards ("at equal or fewer forwards").

    OMP_WAIT_POLICY=PASSIVE python benchmarks/editing.py --model default-edit --split selection \\
        --out benchmarks/results/editing/selection.json
"""

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from unmask.bench.runner import context  # noqa: E402
from unmask.bench.stats import mcnemar_exact, paired_bootstrap  # noqa: E402
from unmask.files import write_json_atomic  # noqa: E402
from unmask.llm import LLM  # noqa: E402
from unmask.params import GenerationParams  # noqa: E402
from unmask.tasks import SPLITS, TASKS, score, split_examples  # noqa: E402

THRESHOLDS = (0.9, 0.7, 0.5, 0.3)
EDITS = ((0.9, 0), (0.5, 0), (0.9, 2), (0.5, 2))  # (edit_threshold, max_post_steps)


def settings(thresholds, edits) -> dict[str, dict]:
    out = {}
    for t in thresholds:
        out[f"off t{t}"] = dict(policy="threshold", threshold=t)
        for e, post in edits:
            out[f"edit t{t} e{e} post{post}"] = dict(policy="edit", threshold=t, edit_threshold=e, max_post_steps=post)
    return out


def decode(llm: LLM, examples, params: GenerationParams, batch: int) -> dict:
    flags, tokens, nfe, edits, seconds = [], 0, 0, 0, 0.0
    for i in range(0, len(examples), batch):
        chunk = examples[i : i + batch]
        t0 = time.perf_counter()
        out = llm.generate([ex.prompt for ex in chunk], params, chat=False)
        seconds += time.perf_counter() - t0
        flags += [score(ex, r.text).exact for ex, r in zip(chunk, out.results)]
        tokens += out.tokens
        nfe += sum(r.nfe for r in out.results)
        edits += sum(r.edits for r in out.results)
    n = len(examples)
    return {"flags": flags, "accuracy": sum(flags) / n, "nfe_per_request": nfe / n, "tokens_per_forward": tokens / nfe,
            "tokens_per_second": tokens / seconds, "edits_per_request": edits / n, "seconds": round(seconds, 1)}


def _spans(report: dict) -> dict:
    """Each task's slice of the flags (tasks in unmask.tasks.TASKS order, equal counts)."""
    n = report["examples"] // len(TASKS)
    return {t: (i * n, (i + 1) * n) for i, t in enumerate(TASKS)}


def compare(a: list[bool], b: list[bool]) -> dict:
    diff, lo, hi = paired_bootstrap(a, b)
    return {"diff": diff, "ci95": [lo, hi], "mcnemar_p": mcnemar_exact(a, b)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default-edit")
    ap.add_argument("--split", default="selection", choices=sorted(SPLITS))
    ap.add_argument("--n", type=int, default=None, help="examples per task (default: the whole split)")
    ap.add_argument("--thresholds", default=",".join(map(str, THRESHOLDS)))
    ap.add_argument("--edits", default=",".join(f"{e}:{p}" for e, p in EDITS), help="edit_threshold:max_post_steps,...")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--out", required=True)
    ap.add_argument("--analyse", action="store_true", help="recompute the comparisons of the finished run in --out")
    a = ap.parse_args()
    if a.analyse:
        import json

        report = json.loads(Path(a.out).read_text())
        analyse(report, report["spans"] if "spans" in report else _spans(report))
        write_json_atomic(a.out, report)
        print_table(report)
        return 0
    llm = LLM(a.model)
    thresholds = [float(t) for t in a.thresholds.split(",")]
    edits = [(float(e), int(p)) for e, p in (x.split(":") for x in a.edits.split(","))] if a.edits else []
    by_task = {t: split_examples(t, a.split, a.n) for t in TASKS}
    examples = [ex for t in TASKS for ex in by_task[t]]
    spans, start = {}, 0
    for t in TASKS:
        spans[t] = (start, start + len(by_task[t]))
        start += len(by_task[t])
    report = {"context": context(), "model": a.model, "split": a.split, "examples": len(examples),
              "setup": {"gen_length": 24, "block_length": 8, "cache": "exact", "batch": a.batch, "greedy": True},
              "results": {}}
    for name, kw in settings(thresholds, edits).items():
        params = GenerationParams(gen_length=24, block_length=8, cache="exact", **kw).check(llm.arch.block_size)
        r = decode(llm, examples, params, a.batch)
        r["per_task"] = {t: sum(r["flags"][i:j]) / (j - i) for t, (i, j) in spans.items()}
        report["results"][name] = r
        print(f"{name:24} acc {100 * r['accuracy']:5.1f}%  pairs {100 * r['per_task']['pairs']:5.1f}%  "
              f"NFE {r['nfe_per_request']:5.2f}  tok/fwd {r['tokens_per_forward']:4.2f}  "
              f"tok/s {r['tokens_per_second']:6.0f}  edits {r['edits_per_request']:4.2f}", file=sys.stderr)
    analyse(report, spans)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(a.out, report)
    print_table(report)
    return 0


def analyse(report: dict, spans: dict) -> None:
    """Paired comparisons of each editing setting: with editing off at the same threshold, with
    the fastest editing-off setting that takes at least as many forwards, and with the most
    accurate editing-off setting (whatever its forwards)."""
    res = report["results"]
    offs = {n: r for n, r in res.items() if n.startswith("off")}
    best_off = max(offs, key=lambda n: (offs[n]["accuracy"], -offs[n]["nfe_per_request"]))
    report["spans"] = spans
    for name, r in res.items():
        if name.startswith("off"):
            continue
        t = name.split()[1]
        base = res[f"off {t}"]
        r["vs_off_same_threshold"] = compare(r["flags"], base["flags"])
        r["vs_off_same_threshold_per_task"] = {
            task: compare(r["flags"][i:j], base["flags"][i:j]) for task, (i, j) in spans.items()}
        slower = [(o["nfe_per_request"], n) for n, o in offs.items() if o["nfe_per_request"] >= r["nfe_per_request"]]
        if slower:
            _, match = min(slower)
            r["vs_off_at_least_as_many_forwards"] = {"setting": match, **compare(r["flags"], res[match]["flags"])}
        r["vs_best_off"] = {"setting": best_off, "nfe_ratio": r["nfe_per_request"] / res[best_off]["nfe_per_request"],
                            **compare(r["flags"], res[best_off]["flags"])}


def print_table(report: dict) -> None:
    res = report["results"]
    print(f"\n{'setting':24} {'acc':>6} {'pairs':>6} {'NFE':>6} {'tok/s':>6} {'vs off, same t [95% CI]':>28} "
          f"{'vs off with >= NFE':>30}")
    for name, r in res.items():
        same = r.get("vs_off_same_threshold")
        more = r.get("vs_off_at_least_as_many_forwards")
        s1 = f"{100 * same['diff']:+.1f} [{100 * same['ci95'][0]:+.1f}, {100 * same['ci95'][1]:+.1f}]" if same else ""
        s2 = (f"{more['setting']}: {100 * more['diff']:+.1f} [{100 * more['ci95'][0]:+.1f}, "
              f"{100 * more['ci95'][1]:+.1f}]") if more else ""
        best = r.get("vs_best_off")
        s3 = (f"{best['setting']}: {100 * best['diff']:+.1f} [{100 * best['ci95'][0]:+.1f}, {100 * best['ci95'][1]:+.1f}]"
              f" at {best['nfe_ratio']:.2f}x NFE") if best else ""
        print(f"{name:24} {100 * r['accuracy']:5.1f}% {100 * r['per_task']['pairs']:5.1f}% {r['nfe_per_request']:6.2f} "
              f"{r['tokens_per_second']:6.0f} {s1:>28} {s2:>30} {s3:>40}")


if __name__ == "__main__":
    raise SystemExit(main())
