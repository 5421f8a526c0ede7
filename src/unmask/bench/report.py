"""Table and quality-speed Pareto plots for a benchmark run."""

from unmask.bench.stats import paired_bootstrap
from unmask.files import save_figure


# rows decoded by the autoregressive twin: alone, or verifying a DFlash drafter's blocks
TWINS = ("ar", "dflash")

def format_table(run: dict) -> str:
    """One row per configuration; `pred ms` is the roofline's time per step for this machine
    (the same forwards as measured), `pred err` its error against the measured time."""
    head = (f"{'configuration':34} {'acc':>6} {'95% CI':>13} {'vs base':>8} {'p':>6} {'NFE':>6} {'tau':>5} "
            f"{'G':>6} {'tok/s':>8} {'p50 ms':>8} {'p95 ms':>8} {'ms/step':>8} {'pred ms':>8} {'pred err':>8}")
    lines = [head]
    for r in run["results"]:
        lo, hi = r["accuracy_ci95"]
        vs = r.get("vs_baseline")
        d = f"{100 * vs['diff']:+.1f}" if vs else "base"
        p = f"{vs['mcnemar_p']:.3f}" if vs else ""
        lines.append(
            f"{r['label']:34} {100 * r['accuracy']:5.1f}% [{100 * lo:4.1f},{100 * hi:5.1f}] {d:>8} {p:>6} "
            f"{r['nfe_per_request']:6.1f} {r['tau']:5.2f} {r['G']:6.1f} {r['tokens_per_s']:8.1f} "
            f"{r['latency_ms']['p50']:8.1f} {r['latency_ms']['p95']:8.1f} {r['ms_per_step']:8.1f} "
            f"{r['ms_per_step'] * (1 + r['prediction_error']):8.1f} {100 * r['prediction_error']:7.0f}%")
    c = run["context"]
    where = c["gpu"] if c.get("gpu") else f"{c['cpu']}, {c['threads']} threads"
    lines.append(f"\n{where}, torch {c['torch']}, {run['dtype']}; "
                 f"{run['n_per_task']} examples x {len(run['tasks'])} tasks; timer: {c['timer_includes']}")
    return "\n".join(lines)


FAST_DLLM = ("threshold", "factor")  # Fast-dLLM's commit rules (with or without its caches)


def load_run(path, flag: str) -> dict:
    """A finished `unmask bench` run's JSON, or an UnmaskError naming `flag` and the file."""
    import json

    from unmask.errors import UnmaskError

    try:
        run = json.loads(open(path, encoding="utf-8").read())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UnmaskError(f"{flag} {path}: not a readable bench JSON ({getattr(e, 'strerror', None) or e})") from None
    if not isinstance(run, dict) or not isinstance(run.get("headline"), list) or not run.get("complete") \
            or not isinstance(run.get("results"), list):
        raise UnmaskError(f"{flag} {path}: not a finished `unmask bench` run (no headline, or \"complete\" is not true)")
    return run


def chosen_from(path, split: str) -> dict:
    """The picks of a finished selection run (its JSON at `path`): per batch, the roles and
    configurations its headline chose, to be measured again on another split. A run on the same
    split, an unfinished run or a file that is not a bench run is refused by name."""
    from unmask.errors import UnmaskError

    sel = load_run(path, "--chosen")
    if sel.get("split", "selection") == split:
        raise UnmaskError(f"--chosen {path} chose its settings on the {split!r} split; report them on another "
                          "split (--split), not on the examples they were chosen on")
    rows = [{k: h[k] for k in ("batch", "role", "label", "config")} for h in sel["headline"] if "config" in h]
    if not rows:
        raise UnmaskError(f"--chosen {path}: its headline names no configuration (written by an older unmask)")
    return {"from": str(path), "split": sel.get("split", "selection"), "examples": sel.get("examples"),
            "n_per_task": sel.get("n_per_task"), "tolerance": sel.get("tolerance", 0.01), "rows": rows}


def _flags(r: dict) -> list[bool] | None:
    f = r.get("flags")
    return None if f is None else [c == "1" for t in sorted(f) for c in f[t]]


def _close(rows: list[dict], base: dict, tolerance: float, rule: str) -> list[dict]:
    """The rows within `tolerance` of `base`: by point estimate ("point"), or ("ci") those whose
    paired 95 % interval against `base` excludes a larger loss (non-inferiority), which a noisy
    split cannot pass by luck as easily."""
    if rule == "point":
        return [r for r in rows if r["accuracy"] >= base["accuracy"] - tolerance - 1e-12]
    b, out = _flags(base), [base]
    for r in rows:
        if r is base:
            continue
        f = _flags(r)
        if f is not None and b is not None:
            lo = paired_bootstrap(f, b)[1]
        elif r.get("vs_baseline") and r["vs_baseline"]["baseline"] == base["label"]:
            lo = r["vs_baseline"]["ci95"][0]
        else:
            continue  # no paired comparison with this base recorded
        if lo >= -tolerance - 1e-12:
            out.append(r)
    return out


def headline(run: dict, tolerance: float = 0.01, rule: str = "point") -> list[dict]:
    """The rows the README reports, per batch size: the baseline (the batch's first diffusion
    configuration), Fast-dLLM's best setting and unmask's best setting (the highest tokens/s among
    configurations within `tolerance` of the baseline's accuracy by `rule`, see _close;
    Fast-dLLM's among its threshold/factor rules), and the AR twin. With a block-diffusion model
    (configurations of model "block"): its first configuration ("block baseline", its own one
    token per step in the presets) and its fastest within `tolerance` of that ("block best")."""
    if run.get("chosen"):
        return _reported(run, tolerance)
    out = []
    for batch in sorted({r["config"]["batch"] for r in run["results"]}):
        rows = [r for r in run["results"] if r["config"]["batch"] == batch]
        diffusion = [r for r in rows if r["config"]["policy"] not in TWINS and r["config"].get("model") != "block"]
        blocks = [r for r in rows if r["config"].get("model") == "block"]
        if not diffusion:
            continue
        base = diffusion[0]
        close = _close(diffusion, base, tolerance, rule)
        fast = [r for r in close if r["config"]["policy"] in FAST_DLLM]
        picks = [("baseline", base)]
        if fast:
            picks.append(("Fast-dLLM best", max(fast, key=lambda r: r["tokens_per_s"])))
        picks.append(("unmask best", max(close, key=lambda r: r["tokens_per_s"])))
        if blocks and (rule == "point" or _flags(blocks[0]) is not None):  # ci needs per-example results
            b0 = blocks[0]
            near = _close(blocks, b0, tolerance, rule)
            picks += [("block baseline", b0), ("block best", max(near, key=lambda r: r["tokens_per_s"]))]
        picks += [("AR twin", r) for r in rows if r["config"]["policy"] == "ar"]
        picks += [("DFlash", r) for r in rows if r["config"]["policy"] == "dflash"]
        for role, r in picks:
            out.append(_headline_row(batch, role, r, base))
    return out


def _headline_row(batch: int, role: str, r: dict, base: dict) -> dict:
    return {"batch": batch, "role": role, "label": r["label"], "config": r["config"], "accuracy": r["accuracy"],
            "accuracy_ci95": r.get("accuracy_ci95"), "vs_baseline": r.get("vs_baseline"),
            "nfe_per_request": r["nfe_per_request"], "tokens_per_s": r["tokens_per_s"],
            "speedup_vs_baseline": r["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else None}


def _reported(run: dict, tolerance: float) -> list[dict]:
    """A report run's headline: the selection run's picks, role by role, measured on this run's
    examples (nothing is picked here). `holds`: the pick is still within `tolerance` of the
    baseline here (point estimate); `shown`: its paired 95 % interval excludes a larger loss."""
    out = []
    for batch, pick in _picks_at(run["chosen"]):
        rows = [r for r in run["results"] if r["config"]["batch"] == batch]
        r = next((r for r in rows if r["config"] == {**pick["config"], "batch": batch}), None)
        base = next((r for r in rows if r["config"]["policy"] not in TWINS), None)
        if r is None or base is None:
            continue
        row = _headline_row(batch, pick["role"], r, base)
        # a block model's best is held against the block model's own baseline, as it was chosen
        ref = base
        if pick["role"] == "block best":
            ref = next((x for x in rows if x["config"].get("model") == "block"), base)
        f, b = _flags(r), _flags(ref)
        if r["config"]["policy"] not in TWINS and pick["role"] != "baseline" and f is not None and b is not None:
            # a pick that is its reference (the baseline was also the fastest within tolerance) holds trivially
            diff, lo, hi = paired_bootstrap(f, b) if r is not ref else (0.0, 0.0, 0.0)
            row["vs_reference"] = {"reference": ref["label"], "diff": diff, "ci95": [lo, hi]}
            row["holds"] = diff >= -tolerance - 1e-12
            row["shown"] = lo >= -tolerance - 1e-12
        out.append(row)
    return out


def _picks_at(chosen: dict) -> list[tuple[int, dict]]:
    """(batch, pick) pairs: the selection run's picks at their own batches, or, when the report run
    names `batches`, every batch's picks of the selection run's first batch at each of them
    (accuracy does not depend on the batch; its speed is measured there)."""
    rows = chosen["rows"]
    if not chosen.get("batches"):
        return [(h["batch"], h) for h in rows]
    first = min(h["batch"] for h in rows)
    return [(b, h) for b in chosen["batches"] for h in rows if h["batch"] == first]


def grid_from_chosen(chosen: dict, with_block: bool) -> list:
    """The configurations a report run measures: each batch's baseline first (the runner compares
    every row of a batch with its first), then the other picks, once each; the AR twin is added by
    the runner."""
    from unmask.bench.grid import BenchConfig
    from unmask.errors import UnmaskError

    grid, seen = [], set()
    rows = sorted(_picks_at(chosen), key=lambda bh: (bh[0], bh[1]["role"] != "baseline"))
    for batch, h in rows:
        cfg = {**h["config"], "batch": batch}
        if cfg["policy"] in TWINS:
            continue
        if cfg.get("model") == "block" and not with_block:
            raise UnmaskError(f"--chosen: the pick {h['label']!r} is a block-diffusion configuration; give "
                              "--block-model as the selection run did")
        key = tuple(sorted(cfg.items()))
        if key not in seen:
            seen.add(key)
            grid.append(BenchConfig(**cfg))
    return grid


def format_headline(rows: list[dict]) -> str:
    lines = [f"{'batch':>5} {'role':15} {'configuration':34} {'acc':>6} {'vs base [95% CI]':>20} {'NFE':>6} "
             f"{'tok/s':>8} {'x base':>7}"]
    for h in rows:
        sp = f"{h['speedup_vs_baseline']:.1f}x" if h["speedup_vs_baseline"] else "-"
        vs = h.get("vs_baseline")
        d = f"{100 * vs['diff']:+.1f} [{100 * vs['ci95'][0]:+.1f}, {100 * vs['ci95'][1]:+.1f}]" if vs else "-"
        held = {True: "", False: "  (not within tolerance here)"}.get(h.get("holds"), "")
        lines.append(f"{h['batch']:>5} {h['role']:15} {h['label']:34} {100 * h['accuracy']:5.1f}% {d:>20} "
                     f"{h['nfe_per_request']:6.1f} {h['tokens_per_s']:8.1f} {sp:>7}{held}")
    return "\n".join(lines)


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points not dominated in (speed up, accuracy up), sorted by speed."""
    front = []
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if not front or y > front[-1][1]:
            front.append((x, y))
    return sorted(front)


def plot_pareto(run: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, key, xlabel, better in ((axes[0], "tokens_per_s", "generated tokens/s", "higher"),
                                    (axes[1], "nfe_per_request", "forwards per request (NFE)", "lower"),
                                    (axes[2], "positions_per_request", "positions recomputed per request", "lower")):
        for j, batch in enumerate(sorted({r["config"]["batch"] for r in run["results"]})):
            colour = colours[j % len(colours)]
            rows = [r for r in run["results"] if r["config"]["batch"] == batch]
            for model, marker, name in (("diffusion", "o", "diffusion"), ("block", "s", "block diffusion")):
                diff = [r for r in rows if r["config"]["policy"] not in TWINS and r["config"].get("model", "diffusion") == model]
                if not diff:
                    continue
                diff = [r for r in diff if key in r]  # runs written before a metric existed lack it
                if not diff:
                    continue
                xs = [r[key] for r in diff]
                ys = [100 * r["accuracy"] for r in diff]
                ax.scatter(xs, ys, s=18, marker=marker, label=f"{name} b{batch}", alpha=0.8, color=colour)
                sign = 1 if better == "higher" else -1
                front = pareto_front([(sign * x, y) for x, y in zip(xs, ys)])
                ax.plot([sign * x for x, _ in front], [y for _, y in front], lw=1, alpha=0.6, color=colour,
                        ls="-" if model == "diffusion" else "--")
            for r in rows:
                if r["config"]["policy"] == "ar" and key in r:
                    ax.scatter([r[key]], [100 * r["accuracy"]], marker="*", s=140, edgecolor="k",
                               color=colour, label=f"AR twin b{batch}")
                if r["config"]["policy"] == "dflash" and key in r:
                    ax.scatter([r[key]], [100 * r["accuracy"]], marker="P", s=110, edgecolor="k",
                               color=colour, label=f"DFlash (AR twin + drafter) b{batch}")
        ax.set(xlabel=xlabel + f" ({better} is better)", ylabel="exact match / validity (%)", xscale="log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"Quality vs speed, {run['n_per_task']} held-out examples x {len(run['tasks'])} tasks "
                 f"({run['context'].get('gpu') or run['context']['cpu']}, {run['dtype']})", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def cache_study(run: dict) -> bool:
    """The run compares refresh rules (an adaptive cache or a refresh interval is among its rows)."""
    return any(r["config"]["cache"] == "adaptive" or r["config"].get("refresh_interval") for r in run["results"])


def plot_caches(run: dict, path: str) -> None:
    """Accuracy against cost for each cache of each commit policy (one row of panels per policy):
    positions recomputed per request (batch-invariant, like the accuracy: the first batch size),
    then tokens/s at each batch size. The fixed-interval family (no cache = a refresh every step,
    DualCache with refresh intervals, DualCache) is a line, every other cache a labelled point; the
    shaded box is issue 13's target: at least 75 % of DualCache's loss against no cache won back
    for at most 25 % more positions than DualCache."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in run["results"] if r["config"]["policy"] not in TWINS and r["config"].get("model") != "block"
            and "positions_per_request" in r]
    if not rows:
        return
    batches = sorted({r["config"]["batch"] for r in rows})
    key = lambda r: (r["config"]["policy"], r["config"]["knob"], r["config"]["block_length"])  # noqa: E731
    policies = list(dict.fromkeys(key(r) for r in rows))
    fig, axes = plt.subplots(len(policies), 1 + len(batches), figsize=(5.2 * (1 + len(batches)), 4.4 * len(policies)),
                             squeeze=False)
    for row_axes, (policy, knob, blk) in zip(axes, policies):
        mine = [r for r in rows if key(r) == (policy, knob, blk)]
        panels = [("positions_per_request", batches[0], "positions recomputed per request (lower is cheaper)")]
        panels += [("tokens_per_s", b, f"generated tokens/s at batch {b} (higher is faster)") for b in batches]
        for ax, (metric, batch, xlabel) in zip(row_axes, panels):
            here = [r for r in mine if r["config"]["batch"] == batch]
            fixed = sorted((r for r in here if r["config"]["cache"] in ("none", "dual")),
                           key=lambda r: r["positions_per_request"])  # in order of refresh frequency
            ax.plot([r[metric] for r in fixed], [100 * r["accuracy"] for r in fixed], "o-", color="0.4",
                    label="fixed intervals (DualCache, rN, none)")
            none = next((r for r in here if r["config"]["cache"] == "none"), None)
            dual = next((r for r in here if r["config"]["cache"] == "dual" and not r["config"].get("refresh_interval")),
                        None)
            if metric == "positions_per_request" and none and dual and none["accuracy"] > dual["accuracy"]:
                floor = 100 * (dual["accuracy"] + 0.75 * (none["accuracy"] - dual["accuracy"]))
                ax.fill_between([dual[metric] * 0.98, 1.25 * dual[metric]], floor, 100 * none["accuracy"] + 1,
                                color="tab:green", alpha=0.08, label="target (issue 13)")
            for j, r in enumerate(here):
                c = r["config"]
                tag = r["label"].split(f"={knob:g} ", 1)[-1].rsplit(" blk", 1)[0]
                if c["cache"] not in ("none", "dual"):
                    ax.scatter([r[metric]], [100 * r["accuracy"]], marker="D" if c["cache"] == "adaptive" else "s",
                               s=30, zorder=3)
                ax.annotate(tag, (r[metric], 100 * r["accuracy"]), fontsize=7, xytext=(4, -3 + 7 * (j % 2)),
                            textcoords="offset points")
            ax.set(xlabel=xlabel, ylabel="exact match / validity (%)", title=f"{policy} {knob:g}, blocks of {blk}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="lower right")
    c = run["context"]
    fig.suptitle(f"Refresh rules: {run['n_per_task']} held-out examples x {len(run['tasks'])} tasks "
                 f"({c.get('gpu') or c['cpu']}, {run['dtype']})", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
