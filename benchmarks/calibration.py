"""Calibration of the commit scores, per commit policy (issue 13, part 2), and eq. 9's budget rule
against the threshold rule at equal tokens per forward.

Each setting decodes the same held-out task examples (blocks of 8, gen 24, greedy, no cache, so
the cache plays no part) with the commit-time observer. For every commit it records the cached
forward's probability of the committed token, its margin and its entropy; the reliability of
each score is measured against two events: the token is the one the reference decode (the same
blocks, one token per step, no cache) puts there, and it is the gold answer's. Per setting: tokens per forward,
answer accuracy, the share of commits that differ from the reference ("errors"), and the errors
a calibrated model would expect (the mean of 1 - probability over the commits). If a policy errs
more than another at the same tokens per forward, comparing the two columns says whether
miscalibration explains it: a rule that spends its error budget on probabilities that
overstate the chance of being right errs more than it expects.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/calibration.py [--n 50] [--out benchmarks/results/calibration]
"""

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from unmask.bench import diagnose  # noqa: E402
from unmask.bench.runner import context  # noqa: E402
from unmask.files import write_json_atomic  # noqa: E402
from unmask.llm import LLM  # noqa: E402
from unmask.params import GenerationParams  # noqa: E402
from unmask.tasks import TASKS  # noqa: E402

SETTINGS = {
    "fixed 1/step": dict(policy="fixed"),
    "fixed 2/step": dict(policy="fixed", steps=12),
    "threshold 0.9": dict(policy="threshold", threshold=0.9),
    "threshold 0.7": dict(policy="threshold", threshold=0.7),
    "threshold 0.5": dict(policy="threshold", threshold=0.5),
    "threshold 0.3": dict(policy="threshold", threshold=0.3),
    "budget 0.5": dict(policy="budget", budget=0.5),
    "budget 1": dict(policy="budget", budget=1.0),
    "budget 2": dict(policy="budget", budget=2.0),
    "budget 4": dict(policy="budget", budget=4.0),
    "factor 1": dict(policy="factor", factor=1.0),
    "entropy 0.5": dict(policy="entropy", gamma=0.5),
    "threshold 0.7 (margin)": dict(policy="threshold", threshold=0.7, confidence="margin"),
}


def row(label: str, s: dict) -> dict:
    cal = s["calibration"]
    return {"setting": label, "tokens_per_forward": s["tokens_per_forward"], "accuracy": s["accuracy"],
            "commits": s["commits"],
            "errors_vs_reference": cal["prob"]["reference"]["error_rate"],
            "expected_errors": 1 - cal["prob"]["reference"]["mean_score"],
            "errors_vs_gold": cal["prob"]["gold"]["error_rate"],
            "ece": {score: {event: cal[score][event]["ece"] for event in ("reference", "gold")} for score in cal}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50, help="examples per task")
    ap.add_argument("--out", default="benchmarks/results/calibration")
    ap.add_argument("--model", default="default")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    llm = LLM(a.model)
    summaries, rows = {}, []
    for label, kw in SETTINGS.items():
        t0 = time.perf_counter()
        params = GenerationParams(gen_length=24, block_length=8, cache="none", **kw).check()
        report = diagnose.run(llm, params, list(TASKS), a.n)
        summaries[label] = report["summary"]
        rows.append(row(label, report["summary"]))
        r = rows[-1]
        print(f"{label:24} tau {r['tokens_per_forward']:4.2f}  acc {100 * r['accuracy']:5.1f}%  errors vs reference "
              f"{100 * r['errors_vs_reference']:5.2f}% (calibrated: {100 * r['expected_errors']:5.2f}%)  "
              f"ECE prob {r['ece']['prob']['reference']:.3f} margin {r['ece']['margin']['reference']:.3f} "
              f"exp(-H) {r['ece']['exp_neg_entropy']['reference']:.3f}  [{time.perf_counter() - t0:.0f} s]",
              file=sys.stderr)
    write_json_atomic(out / "calibration.json", {
        "context": context(), "model": str(llm.path), "tasks": list(TASKS), "n_per_task": a.n,
        "setup": "blocks of 8, gen 24, greedy, no cache; reference = the same blocks, one token per step "
                 "(most confident first), no cache",
        "settings": {k: {**v} for k, v in SETTINGS.items()}, "rows": rows, "summaries": summaries})
    picked = {k: summaries[k] for k in ("threshold 0.9", "threshold 0.5", "budget 1", "budget 4", "fixed 2/step")}
    diagnose.plot_calibration(picked, str(out / "reliability-reference.png"), "reference")
    diagnose.plot_calibration(picked, str(out / "reliability-gold.png"), "gold")
    plot_rules(rows, str(out / "budget-vs-threshold.png"))
    plot_grid(summaries, str(out / "reliability-all.png"))
    return 0


def plot_grid(summaries: dict[str, dict], path: str) -> None:
    """A reliability diagram for every setting (rows) and commit score (columns), against the
    reference decode and against gold, with each curve's ECE."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(summaries), len(diagnose.SCORES), figsize=(11, 2.3 * len(summaries)), squeeze=False)
    for row, (label, summary) in zip(axes, summaries.items()):
        for ax, name in zip(row, diagnose.SCORES):
            ax.plot([0, 1], [0, 1], color="0.7", lw=1)
            for event, style in (("reference", "o-"), ("gold", "s--")):
                cal = summary["calibration"][name][event]
                pts = [r for r in cal["reliability"] if r["n"] >= 5]
                ax.plot([r["confidence"] for r in pts], [r["accuracy"] for r in pts], style, ms=2.5,
                        label=f"{event} (ECE {cal['ece']:.3f})")
            ax.set(xlim=(0, 1), ylim=(0, 1.02), title=f"{label}: {name}")
            ax.title.set_fontsize(8)
            ax.tick_params(labelsize=6)
            ax.legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_rules(rows: list[dict], path: str) -> None:
    """Errors against tokens per forward for the threshold and budget rules (and what a calibrated
    model would expect for the same commits)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for rule, style in (("threshold", "o-"), ("budget", "s-")):
        rs = sorted((r for r in rows if r["setting"].startswith(rule) and "margin" not in r["setting"]),
                    key=lambda r: r["tokens_per_forward"])
        x = [r["tokens_per_forward"] for r in rs]
        line = ax[0].plot(x, [100 * r["errors_vs_reference"] for r in rs], style, label=f"{rule}: measured")[0]
        ax[0].plot(x, [100 * r["expected_errors"] for r in rs], style[0] + ":", mfc="none", color=line.get_color(),
                   label=f"{rule}: expected if calibrated")
        ax[1].plot(x, [100 * r["accuracy"] for r in rs], style, label=rule)
        for r in rs:
            ax[0].annotate(r["setting"].split()[-1], (r["tokens_per_forward"], 100 * r["errors_vs_reference"]),
                           fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax[0].set(xlabel="tokens per forward", ylabel="% commits differing from the reference decode",
              title="commit errors at equal parallelism")
    ax[1].set(xlabel="tokens per forward", ylabel="answer accuracy (%)", title="task accuracy")
    for a in ax:
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
