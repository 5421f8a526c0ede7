"""`unmask diagnose`: run held-out task examples through a cached decode with the commit-time
observer (unmask.engine.diagnostics) and summarise what the cache changed and whether it
predicts wrong answers."""

from collections import defaultdict

from unmask.bench.stats import wilson_interval
from unmask.engine.diagnostics import Observer
from unmask.tasks import held_out, score

CONF_BINS = (0.0, 0.5, 0.7, 0.9, 0.99, 1.0000001)


def run(llm, params, tasks: list[str], n: int, batch_size: int = 32) -> dict:
    obs = Observer()
    outcome: dict[str, dict] = {}
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
            for ex, req in zip(chunk, reqs):
                result = llm._result(req.canvas, req.nfe, req.commits, 0.0)
                outcome[req.id] = {"task": task, "correct": score(ex, result.text).exact, "text": result.text}
    return {"summary": summarise(obs, outcome), "outcomes": outcome, **obs.to_json()}


def _rate(flags: list[bool]) -> dict:
    k, n = sum(flags), len(flags)
    lo, hi = wilson_interval(k, n) if n else (0.0, 0.0)
    return {"n": n, "rate": k / n if n else None, "ci95": [lo, hi]}


def summarise(obs: Observer, outcome: dict[str, dict]) -> dict:
    commits = obs.commits
    by_age, by_bin, by_pos = defaultdict(list), defaultdict(list), defaultdict(list)
    shift_by_age = defaultdict(list)
    for c in commits:
        by_age[c.cache_age].append(not c.agree)
        shift_by_age[c.cache_age].append(abs(c.cached_conf - c.fresh_conf))
        b = next(i for i in range(len(CONF_BINS) - 1) if CONF_BINS[i] <= c.cached_conf < CONF_BINS[i + 1])
        by_bin[(c.cache_age > 0, f"[{CONF_BINS[b]:g}, {min(CONF_BINS[b + 1], 1):g})")].append(not c.agree)
        by_pos[c.in_block].append(not c.agree)
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
        "disagreement_by_position_in_block": {p: _rate(f) for p, f in sorted(by_pos.items())},
        "drift_by_cache_age": {a: {layer: {"key": sum(k for k, _ in v) / len(v), "value": sum(x for _, x in v) / len(v)}
                                   for layer, v in sorted(layers.items())} for a, layers in sorted(drift.items())},
        "tokens_committed_per_step_in_block": {s: sum(v) / len(v) for s, v in sorted(profile.items())},
        "wrong_answer_rate": {"with_a_disagreement": _rate(wrong_if[True]),
                              "without": _rate(wrong_if[False])},
        "accuracy": sum(o["correct"] for o in outcome.values()) / max(len(outcome), 1),
    }
