"""`unmask train`."""

import argparse
import json

from unmask.cli.common import parse_tasks

TRAIN_FLAGS = (("layers", int), ("d-model", int), ("heads", int), ("mlp", int), ("gen-length", int), ("batch", int),
               ("lr", float), ("warmup", int), ("seed", int), ("eval-every", int), ("eval-n", int),
               ("logit-shift", int), ("block-length", int), ("edit-noise", float), ("edit-weight", float),
               ("experts", int), ("top-k", int), ("expert-size", int), ("self-cond", float),
               ("target", str), ("anchors", int), ("loss-gamma", float), ("corpus", str), ("vocab-size", int),
               ("span-rate", float), ("span-pad", int), ("span-expand", float), ("fim-rate", float))


def parse_layers(text: str) -> tuple[int, ...]:
    from unmask.errors import UnmaskError

    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UnmaskError(f"--target-layers {text!r} must be comma-separated layer numbers") from None


def cmd_train(a: argparse.Namespace) -> int:
    from unmask.train.run import train
    from unmask.train.trainer import TrainConfig

    given = {"kind": a.kind, "steps": a.steps, "init_from": a.init_from, "tasks": parse_tasks(a.tasks)}
    given |= {f.replace("-", "_"): getattr(a, f.replace("-", "_")) for f, _ in TRAIN_FLAGS}
    if a.target_layers is not None:
        given["target_layers"] = parse_layers(a.target_layers)
    cfg = TrainConfig(**{k: v for k, v in given.items() if v is not None}).check()
    summary = train(cfg, a.out, resume=a.resume, progress=not a.quiet, until=a.until, overwrite=a.overwrite)
    print(json.dumps(summary))
    return 0


def add_parsers(sub) -> dict:
    """Add this module's commands to the subparsers; returns {name: function}."""
    t = sub.add_parser("train", help="train the embedded model (masked diffusion), a block-diffusion model or the AR twin")
    t.add_argument("--out", required=True, help="run folder (trainer state + model/ checkpoint)")
    t.add_argument("--resume", action="store_true", help="continue the run in --out")
    t.add_argument("--overwrite", action="store_true",
                   help="write into --out even if it holds another run or other files")
    t.add_argument("--until", type=int, default=None,
                   help="stop after this step with a checkpoint (continue later with --resume)")
    t.add_argument("--kind", default="diffusion", help="dflash (a DFlash drafter for the autoregressive --target: "
                   "--layers/--mlp/--block-length are the drafter's, --target-layers, --anchors, --loss-gamma), diffusion (LLaDA objective), block (block diffusion, blocks of "
                   "--block-length), renoise (DiffusionGemma's layout: uniform-token corruption with self-conditioning; "
                   "--experts, --top-k, --expert-size, --self-cond) or ar")
    t.add_argument("--steps", type=int, default=None, help="optimizer steps in total")
    t.add_argument("--tasks", default=None, help="comma-separated task mixture, task or task=weight")
    t.add_argument("--init-from", default=None, help="start from this model or run folder's weights")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.add_argument("--target-layers", default=None,
                   help="dflash: comma-separated target layers the drafter reads (default: all)")
    for name, typ in TRAIN_FLAGS:
        t.add_argument(f"--{name}", type=typ, default=None)
    return {"train": cmd_train}
