"""What the commands share: the parser class, the model and decoding flags (generated from
GenerationParams' fields), loading a model, and the small parsers of list arguments."""

import argparse
import math
from dataclasses import fields

from unmask.cli.models import model_help
from unmask.errors import UnmaskError
from unmask.params import (
    FAST,
    PARAM_FIELDS,
    GenerationParams,
    check_fields,
    coerce,
    field_type,
    resolve_params,
)

MODEL_HELP = model_help()


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, status 2 (argparse prints usage first otherwise)
        raise UnmaskError(message)


def add_model_args(p: argparse.ArgumentParser, json_help: str = "print one JSON object") -> None:
    p.add_argument("--model", default=None, help=MODEL_HELP)
    p.add_argument("--dtype", default=None, help="auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16, float16")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    add_parallel_args(p)
    add_draft_args(p)
    p.add_argument("--json", action="store_true", help=json_help)


def add_draft_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quantize", default=None, choices=("int8", "int4", "fp8"),
                   help="int8: the linear layers' weights in int8, per output channel (CPU: PyTorch's FBGEMM kernels; "
                        "GPU: torchao); int4: 4-bit weights in groups of 32, llama.cpp's Q4_0 (CPU: unmask's kernel, "
                        "built once per machine), an untied output head and the token embedding in int8; "
                        "fp8: float8 weights and activations (GPU with compute capability 8.9+, torchao)")
    p.add_argument("--linear-kernel", default=None, choices=("auto", "default", "onednn"),
                   help="float32 linear layers on CPU: auto (the faster of PyTorch's default and oneDNN per shape, "
                        "measured once per machine; the default), default, onednn (docs/quantization.md)")
    p.add_argument("--draft", default=None, metavar="PATH",
                   help="a DFlash drafter folder (z-lab's layout; 'default-dflash' drafts for 'default-ar'): "
                        "speculative decoding of this autoregressive model, with its own output (docs/speculative.md)")


def add_parallel_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                   help="split the model over N processes on torch.distributed (gloo on CPU, NCCL on GPUs; "
                        "docs/scaling.md)")


def add_decoding_args(p: argparse.ArgumentParser, defaults: str) -> None:
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


def params_from_args(a: argparse.Namespace, model_defaults: dict | None = None, fast: bool = True,
                     block_size: int = 0) -> GenerationParams:
    """Flags the user gave win; then the model's generation defaults; then (with `fast`) unmask's
    fast defaults; then GenerationParams'."""
    return resolve_params(given_params(a), model_defaults, fast, block_size)


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


def positive(flag: str, value) -> None:
    if value is not None and value < 1:
        raise UnmaskError(f"--{flag} {value} must be a positive integer")


def progress_bar(total: int, label: str):
    from unmask.progress import Progress

    return Progress(total, label, unit="ex")


def load_llm(a: argparse.Namespace):
    from unmask.llm import LLM, default_device

    return LLM(a.model, dtype=a.dtype, device=a.device or default_device(),
               tensor_parallel=getattr(a, "tensor_parallel", 1), draft=getattr(a, "draft", None),
               quantize=getattr(a, "quantize", None), linear_kernel=getattr(a, "linear_kernel", None))


def add_data_parallel_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-parallel", type=int, default=1, metavar="N",
                   help="spread the batches over N Ray Data actors, one model each (same per-example results; "
                        "pip install 'unmask[ray]')")
    p.add_argument("--ray-address", default=None,
                   help="with --data-parallel: join this Ray cluster ('auto': the one running here; default: a new "
                        "local instance)")


def check_data_parallel(a: argparse.Namespace) -> None:
    """--data-parallel, --ray-address and what they combine with, checked before anything loads."""
    from unmask.cluster import check_reachable, parse_ray_address

    n = getattr(a, "data_parallel", 1)
    positive("data-parallel", n)
    address = getattr(a, "ray_address", None)
    if address is not None and n == 1:
        raise UnmaskError(f"--ray-address {address!r} is used with --data-parallel N > 1 (one process otherwise)")
    parse_ray_address(address)
    if n > 1 and getattr(a, "tensor_parallel", 1) != 1:
        raise UnmaskError(f"--data-parallel {n} with --tensor-parallel {a.tensor_parallel}: each Ray Data actor "
                          "holds a whole model in one process; use one of the two (or `unmask serve --replicas N "
                          "--tensor-parallel M` for replicas of a split model)")
    if n > 1:
        check_reachable(address)  # before any model loads: a cluster that is not there is named in seconds


def data_parallel(llm, a: argparse.Namespace):
    """`llm`, or with --data-parallel N > 1 the same model on N Ray Data actors."""
    check_data_parallel(a)
    n = getattr(a, "data_parallel", 1)
    if n == 1:
        return llm
    from unmask.bench.data_parallel import DataParallelLLM

    return DataParallelLLM(llm, n, getattr(a, "ray_address", None))


def load_for_eval(a: argparse.Namespace):
    """Model and reference-setting parameters for the evaluation commands."""
    positive("n", a.n)
    positive("batch-size", a.batch_size)
    check_data_parallel(a)
    given_params(a)
    llm = load_llm(a)
    return data_parallel(llm, a), params_for(llm, a, fast=False)


def params_for(llm, a: argparse.Namespace, fast: bool) -> GenerationParams:
    """The decoding parameters for this model, accepted for it (unmask.engine.accept: the flags given are
    what it checks an autoregressive model against)."""
    given = given_params(a)
    return llm.params_for(given, fast)


FAST_TEXT = ("the checkpoint's generation_config.json, else unmask's fast defaults ("
             + ", ".join(f"{k} {v}" for k, v in FAST.items()) + "), else the reference setting")


REFERENCE_TEXT = "the checkpoint's canvas shape, and the reference setting: one token per step, no cache"
