"""`unmask diagnose`: run held-out task examples through a cached decode with the commit-time
observer (unmask.engine.diagnostics) and summarise what the cache changed and whether it
predicts wrong answers."""

import dataclasses
import math
from collections import defaultdict

from unmask.bench.stats import wilson_interval
from unmask.files import save_figure
from unmask.engine.diagnostics import Observer
from unmask.tasks import held_out, score

CONF_BINS = (0.0, 0.5, 0.7, 0.9, 0.99, 1.0000001)


def run(llm, params, tasks: list[str], n: int, batch_size: int = 32) -> dict:
    obs = Observer()
    outcome: dict[str, dict] = {}
    # the reference: the same blocks, one token per step (most confident first), no cache
    reference = dataclasses.replace(params, policy="fixed", steps=params.gen_length,
                                    cache="none", refresh_interval=None, temperature=0.0, top_k=None, top_p=None,
                                    confidence="prob", remasking="low_confidence").check()
    for task in tasks:
        examples = held_out(task, n)
        for i in range(0, n, batch_size):
            chunk = examples[i : i + batch_size]
            engine = llm.engine()
            engine.observer = obs
            ids = llm.encode([ex.prompt for ex in chunk], chat=False)
            reqs = [engine.add_request(p, params, request_id=f"{task}-{i + j}") for j, p in enumerate(ids)]
            while engine.has_unfinished():
                engine.step()
            ref = llm.generate(ids, reference).results  # one token per step, no cache
            eos = llm.token_ids.eos
            for ex, req, r in zip(chunk, reqs, ref):
                result = llm.result_of(req.canvas, req.nfe, req.commits, 0.0)
                gold = llm.tokenizer.encode(ex.answer, add_special_tokens=False)
                gold = (gold + [eos] * params.gen_length)[: params.gen_length]  # the answer, then end-of-text padding
                outcome[req.id] = {"task": task, "correct": score(ex, result.text).exact, "text": result.text,
                                   "reference": r.raw_ids, "gold": gold, "nfe": req.nfe}
    return {"summary": summarise(obs, outcome), "outcomes": outcome, **obs.to_json()}


# the three commit scores, each read as a number in [0, 1]: the probability of the committed
# token, the margin (top-1 minus top-2 probability), and exp(-entropy) (1 for a one-hot
# distribution, 1/k for a uniform one over k tokens; the monotone image of neg_entropy)
SCORES = {"prob": lambda c: c.cached_conf, "margin": lambda c: c.cached_margin,
          "exp_neg_entropy": lambda c: math.exp(-c.cached_entropy)}


def calibration(commits, outcome: dict[str, dict], bins: int = 10) -> dict:
    """Reliability of each commit score (SCORES, from the cached forward that committed) for two
    events: the token is the one the reference decode (the same blocks, one token per step, no
    cache) puts there, and the token is the gold answer's (the answer, then end-of-text padding;
    for tasks with several valid answers this is one of them). Expected calibration error over
    equal-width bins; the error rate is the share of commits where the event fails."""
    out = {}
    for name, value in SCORES.items():
        out[name] = {}
        for event in ("reference", "gold"):
            table = [[0, 0.0, 0] for _ in range(bins)]  # count, score sum, hits
            for c in commits:
                o = outcome.get(c.request)
                if o is None:
                    continue
                v = value(c)
                b = min(int(v * bins), bins - 1)
                table[b][0] += 1
                table[b][1] += v
                table[b][2] += o[event][c.position] == c.token
            total = sum(t[0] for t in table)
            rows = [{"bin": [i / bins, (i + 1) / bins], "n": t[0], "confidence": t[1] / t[0], "accuracy": t[2] / t[0]}
                    for i, t in enumerate(table) if t[0]]
            ece = sum(r["n"] / total * abs(r["confidence"] - r["accuracy"]) for r in rows) if total else None
            errors = 1 - sum(r["n"] * r["accuracy"] for r in rows) / total if total else None
            mean = sum(t[1] for t in table) / total if total else None
            out[name][event] = {"ece": ece, "error_rate": errors, "mean_score": mean, "reliability": rows, "n": total}
    return out


# cheap signals an adaptive cache could read before or at a cached commit (higher = more suspect)
SIGNALS = {"cache_age": lambda c: c.cache_age, "tokens_since_refresh": lambda c: c.since_refresh,
           "one_minus_cached_prob": lambda c: 1 - c.cached_conf, "one_minus_margin": lambda c: 1 - c.cached_margin,
           "cached_entropy": lambda c: c.cached_entropy}


def signal_auc(commits) -> dict:
    """For commits made from a cached forward: how well each signal ranks the commits whose fresh
    top token differs above those where it agrees (ROC AUC; 0.5 = no better than chance)."""
    cached = [c for c in commits if c.cache_age > 0]
    pos = sum(not c.agree for c in cached)
    neg = len(cached) - pos
    out = {"cached_commits": len(cached), "disagreeing": pos}
    for name, f in SIGNALS.items():
        if not pos or not neg:
            out[name] = None
            continue
        ranked = sorted(cached, key=f)
        # Mann-Whitney: mean rank of the disagreeing commits, ties sharing their average rank
        rank_sum, i = 0.0, 0
        while i < len(ranked):
            j = i
            while j < len(ranked) and f(ranked[j]) == f(ranked[i]):
                j += 1
            avg = (i + j + 1) / 2
            rank_sum += avg * sum(not c.agree for c in ranked[i:j])
            i = j
        out[name] = (rank_sum - pos * (pos + 1) / 2) / (pos * neg)
    return out


def _rate(flags: list[bool]) -> dict:
    k, n = sum(flags), len(flags)
    lo, hi = wilson_interval(k, n) if n else (0.0, 0.0)
    return {"n": n, "rate": k / n if n else None, "ci95": [lo, hi]}


def summarise(obs: Observer, outcome: dict[str, dict]) -> dict:
    commits = obs.commits
    by_age, by_bin, by_pos, by_since = defaultdict(list), defaultdict(list), defaultdict(list), defaultdict(list)
    shift_by_age = defaultdict(list)
    by_age_bin = defaultdict(lambda: defaultdict(list))  # age -> confidence bin -> (disagrees, |shift|)
    for c in commits:
        by_age[c.cache_age].append(not c.agree)
        shift_by_age[c.cache_age].append(abs(c.cached_conf - c.fresh_conf))
        b = next(i for i in range(len(CONF_BINS) - 1) if CONF_BINS[i] <= c.cached_conf < CONF_BINS[i + 1])
        label = f"[{CONF_BINS[b]:g}, {min(CONF_BINS[b + 1], 1):g})"
        by_bin[(c.cache_age > 0, label)].append(not c.agree)
        by_age_bin[c.cache_age][label].append((not c.agree, abs(c.cached_conf - c.fresh_conf)))
        by_pos[c.in_block].append(not c.agree)
        if c.cache_age > 0:
            by_since[c.since_refresh].append(not c.agree)
    drift = defaultdict(lambda: defaultdict(list))
    for d in obs.drift:
        for layer, (k, v) in enumerate(zip(d.key_drift, d.value_drift)):
            drift[d.cache_age][layer].append((k, v))
    per_step = defaultdict(lambda: defaultdict(int))
    for c in commits:
        per_step[(c.request, c.block)][c.step] += 1
    profile = defaultdict(list)
    for steps in per_step.values():
        for step, k in steps.items():
            profile[step].append(k)
    disagreed = {c.request for c in commits if not c.agree}
    wrong_if = {flag: [not o["correct"] for rid, o in outcome.items() if (rid in disagreed) == flag]
                for flag in (True, False)}
    return {
        "commits": len(commits),
        "disagreement": _rate([not c.agree for c in commits]),
        "mean_kl": sum(c.kl for c in commits) / len(commits) if commits else None,
        "disagreement_by_cache_age": {a: _rate(f) for a, f in sorted(by_age.items())},
        "mean_confidence_shift_by_cache_age": {a: sum(v) / len(v) for a, v in sorted(shift_by_age.items())},
        "disagreement_by_cached_step_and_confidence": {f"{'cached' if k[0] else 'exact'} {k[1]}": _rate(f)
                                                        for k, f in sorted(by_bin.items())},
        "by_cache_age_and_confidence": {
            a: {b: {**_rate([d for d, _ in v]), "mean_confidence_shift": sum(x for _, x in v) / len(v)}
                for b, v in sorted(bins.items())} for a, bins in sorted(by_age_bin.items())},
        "disagreement_by_position_in_block": {p: _rate(f) for p, f in sorted(by_pos.items())},
        "drift_by_cache_age": {a: {layer: {"key": sum(k for k, _ in v) / len(v), "value": sum(x for _, x in v) / len(v)}
                                   for layer, v in sorted(layers.items())} for a, layers in sorted(drift.items())},
        "tokens_committed_per_step_in_block": {s: sum(v) / len(v) for s, v in sorted(profile.items())},
        "wrong_answer_rate": {"with_a_disagreement": _rate(wrong_if[True]),
                              "without": _rate(wrong_if[False])},
        "accuracy": sum(o["correct"] for o in outcome.values()) / max(len(outcome), 1),
        "tokens_per_forward": len(commits) / max(sum(o.get("nfe", 0) for o in outcome.values()), 1),
        "disagreement_by_tokens_since_refresh": {k: _rate(f) for k, f in sorted(by_since.items())},
        "signal_auc": signal_auc(commits),
        "calibration": calibration(commits, outcome),
    }


def plot(summary: dict, path: str) -> None:
    """Four panels: disagreement and confidence shift against cache age, key drift per layer
    against cache age, tokens committed per step in a block, wrong-answer rate with and without
    a disagreement at commit time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 4, figsize=(16, 3.6))
    by_age = summary["disagreement_by_cache_age"]
    ages = [int(a) for a in by_age]
    rates = [by_age[a]["rate"] for a in by_age]
    err = [[r - by_age[a]["ci95"][0] for a, r in zip(by_age, rates)], [by_age[a]["ci95"][1] - r for a, r in zip(by_age, rates)]]
    ax[0].errorbar(ages, rates, yerr=err, fmt="o-", capsize=3, label="top token differs")
    shift = summary["mean_confidence_shift_by_cache_age"]
    ax[0].plot([int(a) for a in shift], list(shift.values()), "s--", label="mean |confidence shift|")
    ax[0].set(xlabel="cache age (steps since the last full forward)", title="cached vs fresh at commit")
    ax[0].legend(fontsize=8)
    drift = summary["drift_by_cache_age"]
    layers = sorted({int(layer) for d in drift.values() for layer in d})
    for layer in layers:
        pts = [(int(a), d[layer]["key"] if layer in d else d[str(layer)]["key"]) for a, d in drift.items()
               if layer in d or str(layer) in d]
        ax[1].plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"layer {layer}")
    ax[1].set(xlabel="cache age", title="relative key drift", yscale="log")
    if layers:
        ax[1].legend(fontsize=8)
    prof = summary["tokens_committed_per_step_in_block"]
    ax[2].bar([int(k) for k in prof], list(prof.values()))
    ax[2].set(xlabel="step in block", title="tokens committed per step")
    w = summary["wrong_answer_rate"]
    labels = ["with a disagreement", "without"]
    vals = [w["with_a_disagreement"]["rate"] or 0, w["without"]["rate"] or 0]
    ax[3].bar(labels, vals)
    ax[3].set(title="wrong answers", ylim=(0, 1))
    for i, key in enumerate(("with_a_disagreement", "without")):
        ax[3].text(i, vals[i] + 0.02, f"n={w[key]['n']}", ha="center", fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def plot_calibration(runs: dict[str, dict], path: str, event: str = "reference") -> None:
    """Reliability diagrams, one panel per commit score, one line per run (label -> summary):
    how often a commit with that score is right (`event`: the reference decode's token, or gold)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, len(SCORES), figsize=(5 * len(SCORES), 4.2))
    for a, name in zip(ax, SCORES):
        a.plot([0, 1], [0, 1], color="0.7", lw=1)
        for label, summary in runs.items():
            cal = summary["calibration"][name][event]
            rows = [r for r in cal["reliability"] if r["n"] >= 5]  # bins with a handful of commits at least
            a.plot([r["confidence"] for r in rows], [r["accuracy"] for r in rows], "o-", ms=3,
                   label=f"{label} (ECE {cal['ece']:.3f})")
        a.set(xlabel=f"{name} of the committed token", ylabel=f"share equal to the {event}", xlim=(0, 1),
              ylim=(0, 1.02), title=name)
        a.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
