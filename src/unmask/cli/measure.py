"""Measuring commands: bench and roofline."""

import argparse
import json
import math
import sys
import time

from unmask.cli.common import (add_data_parallel_args, check_data_parallel, data_parallel, parse_tasks, positive,
                               progress_bar)
from unmask.errors import UnmaskError
from unmask.files import check_figure_path, output_file, output_folder, writable_folder, write_json_atomic
from unmask.params import GenerationParams


def cmd_bench(a: argparse.Namespace) -> int:

    from unmask.bench.grid import (
        PRESETS,
        build_grid,
        parse_caches,
        parse_ints,
        parse_policies,
    )
    from unmask.tasks import TASKS

    preset = PRESETS["quick" if a.quick else "full"]
    pick = lambda name: getattr(a, name) if getattr(a, name) is not None else preset.get(name)  # noqa: E731
    if not (math.isfinite(a.tolerance) and 0 <= a.tolerance < 100):
        raise UnmaskError(f"--tolerance {a.tolerance:g} must be a number of accuracy points in [0, 100)")
    if a.headline_of is not None:
        return rehead(a)
    chosen = None
    if a.chosen is not None:  # measure a selection run's picks on another split; choose nothing here
        from unmask.bench.report import chosen_from

        given = [f for f in ("policies", "caches", "refresh", "blocks", "gens", "block_policies", "quick")
                 if getattr(a, f) not in (None, False)]
        if given:
            raise UnmaskError(f"--chosen measures the selection run's picks; {', '.join('--' + f.replace('_', '-') for f in given)} "
                              "would choose again (give them to the selection run)")
        chosen = chosen_from(a.chosen, a.split)
        chosen["batches"] = parse_ints("batches", a.batches) if a.batches else None
    policies = parse_policies(pick("policies"))
    caches = parse_caches(pick("caches"))
    tasks = list(parse_tasks(pick("tasks")) or TASKS) if pick("tasks") else list(TASKS)
    n = pick("n")
    positive("n", n)
    refresh = parse_ints("refresh", pick("refresh"), minimum=0)
    blocks, batches = parse_ints("blocks", pick("blocks")), parse_ints("batches", pick("batches"))
    gens = parse_ints("gens", a.gens) if a.gens else None
    from unmask.bench.report import cache_study, format_headline, format_table, headline, plot_caches, plot_pareto
    from unmask.bench.runner import run_grid, with_ar_twin
    from unmask.llm import LLM

    out = output_folder(a.out, "--out")  # checked now, made once every setting is checked
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = out / f"bench-{stamp}.json"
    from unmask.llm import default_device

    device = a.device or default_device()
    check_data_parallel(a)
    diffusion = data_parallel(LLM(a.model, dtype=a.dtype, device=device), a)
    if a.draft is not None and a.ar_model == "none":
        raise UnmaskError("--draft drafts for the AR twin; give --ar-model (not none)")
    ar = None if a.ar_model == "none" else data_parallel(LLM(a.ar_model, dtype=a.dtype, device=device, draft=a.draft), a)
    gens = gens or [diffusion.generation_defaults.get("gen_length", GenerationParams.gen_length)]
    grid = build_grid(policies, caches, refresh, blocks, gens, batches)  # every setting checked here
    block = None
    if a.block_model is not None:  # a block-diffusion model on the same examples, with its exact cache
        block = data_parallel(LLM(a.block_model, dtype=a.dtype, device=device), a)
        if not block.arch.block_size:
            raise UnmaskError(f"--block-model {a.block_model} is not a block-diffusion model (no bd_size)")
        block_policies = parse_policies(a.block_policies) if a.block_policies else policies
        block_caches = parse_caches(a.block_caches)
        grid += build_grid(block_policies, block_caches, [0], [block.arch.block_size], gens, batches, "block")
        grid.sort(key=lambda c: c.batch)
    if chosen is not None:
        from unmask.bench.report import grid_from_chosen

        grid = grid_from_chosen(chosen, block is not None)
        for c in grid:
            c.params()  # a pick this unmask cannot run is named before anything is measured
    from unmask.evaluate import examples_of

    for t in tasks:
        examples_of(t, n, a.split)  # the split holds n examples of each task
    writable_folder(out, "bench output folder")  # before anything is measured

    def progress(i, total, run):
        write_json_atomic(path, {**run, "complete": False})  # an interrupted run keeps what it measured
        row = run["results"][-1]
        if not a.quiet:
            print(f"\r[{i}/{total}] {row['label']:34} acc {100 * row['accuracy']:5.1f}%  "
                  f"{row['tokens_per_s']:7.1f} tok/s  NFE {row['nfe_per_request']:5.1f}", file=sys.stderr)

    configs = with_ar_twin(grid, a.draft is not None) if ar is not None else grid
    bar = progress_bar(len(configs) * len(tasks) * n, "bench ")
    bar.enabled = bar.enabled and not a.quiet
    run = run_grid(diffusion, ar, grid, tasks, n, progress, on_examples=bar.update, block=block, split=a.split,
                   chosen=chosen)
    bar.close()
    run["tolerance"], run["rule"] = a.tolerance / 100, a.rule
    run["headline"] = headline(run, a.tolerance / 100, a.rule)
    write_json_atomic(path, {**run, "complete": True})
    plot_pareto(run, str(path.with_suffix(".png")))
    if cache_study(run):
        plot_caches(run, str(path.with_suffix(".caches.png")))
    print(format_table(run))
    if chosen is None:
        print(f"\nwithin {a.tolerance:g} point(s) of the baseline's accuracy on the {a.split} split "
              f"(rule {a.rule}), fastest:\n" + format_headline(run["headline"]))
    else:
        print(f"\nthe picks of {chosen['from']} (chosen on its {chosen['split']} split), measured on the {a.split} "
              "split:\n" + format_headline(run["headline"]))
    print(f"wrote {path} and .png", file=sys.stderr)
    return 0


def rehead(a: argparse.Namespace) -> int:
    """--headline-of FILE: choose again from a finished run's measurements with --rule and
    --tolerance (nothing is measured), rewrite its headline, print it."""
    from unmask.bench.report import format_headline, headline, load_run

    path = output_file(a.headline_of, "--headline-of")
    run = load_run(path, "--headline-of")
    run["tolerance"], run["rule"] = a.tolerance / 100, a.rule
    run["headline"] = headline(run, a.tolerance / 100, a.rule)
    write_json_atomic(path, run)
    print(f"within {a.tolerance:g} point(s) of the baseline (rule {a.rule}), fastest:\n" + format_headline(run["headline"]))
    return 0


def cmd_roofline(a: argparse.Namespace) -> int:
    from unmask.bench import roofline as rl
    from unmask.bench import roofline_tables as rt
    from unmask.bench.grid import parse_ints

    batches = parse_ints("batches", a.batches)  # every flag is checked, whichever output follows
    rl.check_setup(a.prompt, a.gen, a.tau, a.block, batches)
    if a.bytes_per_param is not None and not (math.isfinite(a.bytes_per_param) and a.bytes_per_param > 0):
        raise UnmaskError(f"--bytes-per-param {a.bytes_per_param:g} must be a finite number > 0")
    if a.params is not None and not (math.isfinite(a.params) and a.params > 0):
        raise UnmaskError(f"--params {a.params:g} must be a finite number > 0")
    defaults = {k: ROOFLINE_DEFAULTS[k] for k in ("prompt", "gen", "tau", "block", "batches")}
    custom = (any(v is not None for v in (a.hardware, a.model, a.params, a.plot, a.bytes_per_param, a.tensor_parallel,
                                           a.weights)) or a.step_table
              or a.json or a.attention or a.draft_layers is not None or any(getattr(a, k) != v for k, v in defaults.items()))
    if not custom:  # no flag at all: seed 000's worked example
        print(rl.seed_example())
        return 0
    if a.plot is not None:
        check_figure_path(a.plot, "--plot")
    arch = None
    if a.model is not None:
        from unmask.llm import resolve_model_path
        from unmask.models.loader import read_json
        from unmask.models.registry import resolve_family

        from unmask.bench.shapes import shape

        arch = shape(a.model)  # a released model's published shape, or a checkpoint's config
        if arch is None:
            folder = resolve_model_path(a.model)
            cfg = read_json(folder / "config.json")
            arch = resolve_family(cfg).arch_of(cfg, folder)
    if a.step_table:  # one forward of this model on this CPU (float32, int8) beside the GPU presets
        if arch is None:
            raise UnmaskError("--step-table needs --model (e.g. llada-8b)")
        rls = {f"cpu {w}": rl.build("cpu", arch, None, None, a.attention, w) for w in rl.WEIGHTS}
        rls.update({f"{h} bf16": rl.build(h, arch, None, None, a.attention) for h in ("h200", "h100-sxm")})
        table = rt.step_table(rls, arch, a.prompt if a.attention else 0, batches=batches)
        print(json.dumps(table) if a.json else rt.format_step_table(table))
        return 0
    model = rl.build(a.hardware, arch, a.params, a.bytes_per_param, a.attention, a.weights)
    if a.draft_layers is not None:  # DFlash speculative decoding of this (autoregressive) target
        if arch is None or a.draft_layers < 1:
            raise UnmaskError(f"--draft-layers {a.draft_layers} needs --model (the target's shape) and a positive "
                              "number of drafter layers")
        from dataclasses import replace as _replace

        bpp = a.bytes_per_param or 2.0
        draft = _replace(model, model=rt.draft_cost(arch, a.draft_layers, a.draft_layers, bpp))
        taus = sorted({a.tau, 2.0, 4.0, 6.0}) if a.tau != ROOFLINE_DEFAULTS["tau"] else (2.0, 4.0, 6.0)
        taus = [t for t in taus if t <= a.block]  # an acceptance length never exceeds the block verified
        table = rt.speculative_table(model, draft, a.prompt, a.block, taus, batches)
        print(json.dumps(table) if a.json else rt.format_speculative(table, model.hw))
        return 0
    if a.tensor_parallel is not None:  # the step times of N ranks of one node
        worlds = parse_ints("tensor-parallel", a.tensor_parallel)
        if arch is None:
            raise UnmaskError("--tensor-parallel needs --model (the layer and hidden sizes come from its config)")
        if (a.hardware or "h100-sxm") not in rt.LINKS:
            raise UnmaskError(f"--tensor-parallel prices GPU links; choose --hardware {', '.join(rt.LINKS)}")
        table = rt.tp_table(model, arch, rt.LINKS[a.hardware or "h100-sxm"], worlds,
                            context=a.prompt + a.gen if a.attention else 0,
                            gpu_memory=rt.GPU_MEMORY[a.hardware or "h100-sxm"])
        print(json.dumps(table) if a.json else rt.format_tp(table, model.hw))
        return 0
    own = rt.own_cost(model, arch, a.prompt, batches)  # a renoising model: its cost per canvas
    if own is not None:
        if a.plot:
            raise UnmaskError(f"--plot draws AR against masked diffusion; a {arch.family} model prints its table")
        print(json.dumps(own[0]) if a.json else own[1])
        return 0
    pred = rl.predict(model, a.prompt, a.gen, a.tau, a.block, batches)
    if a.plot:
        rl.plot_prediction(model, pred, a.plot)
    print(json.dumps(pred) if a.json else rl.format_prediction(pred))
    return 0


ROOFLINE_DEFAULTS = {"prompt": 512, "gen": 256, "tau": 4.0, "block": 32, "batches": "1,8,64,256"}


def add_parsers(sub) -> dict:
    """Add this module's commands to the subparsers; returns {name: function}."""
    b = sub.add_parser("bench", help="quality and speed of a grid of decoding settings, with the AR twin")
    b.add_argument("--model", default=None, help="diffusion model folder (default: the embedded model)")
    b.add_argument("--ar-model", default="default-ar", help="AR twin folder, or 'none' to skip it")
    b.add_argument("--draft", default=None, metavar="PATH",
                   help="a DFlash drafter for --ar-model (e.g. default-dflash): adds its speculative decoding "
                        "(DFlash rows) beside the AR twin's")
    b.add_argument("--block-model", default=None,
                   help="also measure a block-diffusion model (e.g. default-block) on the same examples")
    b.add_argument("--block-policies", default=None, help="its policy:knob list (default: --policies)")
    b.add_argument("--block-caches", default="exact", help="its cache policies (default: exact)")
    b.add_argument("--dtype", default=None, help="auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16, float16")
    b.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    add_data_parallel_args(b)
    b.add_argument("--quick", action="store_true", help="a few-minute preset")
    b.add_argument("--policies", default=None, help="policy:knob list, e.g. fixed:1,threshold:0.9,entropy:0.5")
    b.add_argument("--caches", default=None,
                   help="cache policies, e.g. none,dual,dual:r2,adaptive:p0.9 (an entry's own settings: rN a refresh "
                        "every N steps; the adaptive cache's tN, pC, canvas|suffix)")
    b.add_argument("--refresh", default=None, help="refresh intervals, 0 = only at block starts")
    b.add_argument("--blocks", default=None, help="block lengths")
    b.add_argument("--gens", default=None, help="generation lengths (default: the model's)")
    b.add_argument("--batches", default=None, help="batch sizes")
    b.add_argument("--tasks", default=None)
    b.add_argument("--n", type=int, default=None, help="examples per task")
    b.add_argument("--out", default="bench_out", help="folder for the JSON and the Pareto PNG")
    b.add_argument("--split", default="selection", choices=("selection", "report"),
                   help="held-out examples 0-249 of each task (selection: choose settings here) or 250-999 (report)")
    b.add_argument("--tolerance", type=float, default=1.0,
                   help="accuracy points below the baseline that the headline's 'best' may lose (default 1)")
    b.add_argument("--rule", default="point", choices=("point", "ci"),
                   help="what 'within --tolerance' means for the headline's 'best': the point estimate, or "
                        "(ci) the paired 95%% interval's lower end (non-inferiority)")
    b.add_argument("--headline-of", default=None,
                   help="a finished run's JSON: choose its headline again with --rule/--tolerance, measuring nothing")
    b.add_argument("--chosen", default=None,
                   help="a selection run's JSON: measure its headline picks (baseline, best, AR twin) on --split "
                        "instead of choosing again; with --batches, the picks of its first batch at each of them")
    b.add_argument("--quiet", action="store_true")

    r = sub.add_parser("roofline", help="predict AR vs diffusion latency and throughput (seed 000's cost model)")
    r.add_argument("--hardware", default=None, help="h100-sxm, h200, a100-80gb or cpu (measured now)")
    r.add_argument("--model", default=None, help="checkpoint folder, 'default' for the model's size, or a published "
                   "shape: llada-8b, llada2-mini, llada2-flash, diffusiongemma-26b-a4b")
    r.add_argument("--params", type=float, default=None, help="parameter count instead of --model (e.g. 7e9)")
    r.add_argument("--bytes-per-param", type=float, default=None,
                   help="default: 4 on cpu (float32; 1 with --weights int8), else 2")
    r.add_argument("--weights", default=None, choices=("float32", "int8"),
                   help="with --hardware cpu: the weight type whose kernel is measured (int8: unmask's --quantize "
                        "int8 layers; the embedding and head stay float32)")
    r.add_argument("--step-table", action="store_true",
                   help="one forward of --model at G = 1, 8, 32 positions per row (AR and block diffusion) on this "
                        "CPU in float32 and int8, beside the H200 and H100 presets (--prompt: the cached context "
                        "with --attention)")
    r.add_argument("--attention", action="store_true", help="add KV-cache reads and attention FLOPs")
    d = ROOFLINE_DEFAULTS
    r.add_argument("--prompt", type=int, default=d["prompt"])
    r.add_argument("--gen", type=int, default=d["gen"])
    r.add_argument("--tau", type=float, default=d["tau"], help="tokens committed per forward")
    r.add_argument("--block", type=int, default=d["block"], help="positions recomputed per cached step (G)")
    r.add_argument("--batches", default=d["batches"])
    r.add_argument("--plot", default=None, help="write a throughput-vs-batch PNG here")
    r.add_argument("--draft-layers", type=int, default=None, metavar="N",
                   help="DFlash: a drafter of N layers for the autoregressive --model (qwen3-8b's released drafter "
                        "has 5; --block is its block size, --tau its acceptance length)")
    r.add_argument("--tensor-parallel", default=None, metavar="N,...",
                   help="step times on N GPUs of one node (e.g. 1,2,4,8), with the all-reduces they add")
    r.add_argument("--json", action="store_true")
    return {"bench": cmd_bench, "roofline": cmd_roofline}
