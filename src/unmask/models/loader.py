"""Strict loader for a local checkpoint: a Hugging Face folder (single or sharded safetensors) or
a GGUF file.

The family is resolved from the config, the module built on the meta device and filled with the
checkpoint's tensors (unmask.models.reading), so the weights are held in memory once; this module
decides what is built and by which rules (dtype, device, tensor-parallel shard, which layers are
quantized as read, the float32 linear kernel). Any missing file, unknown architecture, missing or
unexpected key, or shape mismatch is a CheckpointError that names it.
"""

import contextlib
import json
import os
import warnings
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from unmask.errors import CheckpointError, UnmaskError, UnmaskWarning
from unmask.files import file_inside_file
from unmask.models.base import DiffusionLM
from unmask.models.gguf import GGUFFile, is_gguf
from unmask.models.parallel import check_divisible
from unmask.models.reading import few, fill, safetensors_file
from unmask.models.registry import resolve_family

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# buffers some exporters write that are recomputed here, never parameters
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def read_json(path: Path) -> dict:
    """A JSON object from a checkpoint file, or a CheckpointError naming the file and the fault."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"missing file {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from None
    except OSError as e:
        raise CheckpointError(f"{path} could not be read: {e.strerror or e}") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path} must hold a JSON object, not {type(value).__name__}")
    return value


def resolve_dtype(name: str | None, device: torch.device) -> torch.dtype:
    """'auto'/None: float32 on CPU (bf16 is several times slower there), bfloat16 on GPU."""
    if name in (None, "auto"):
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if name not in DTYPES:
        raise CheckpointError(f"unknown dtype {name!r}; choose one of auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def weight_files(folder: Path) -> dict[str, Path]:
    """tensor name -> shard file, from model.safetensors.index.json or a single model.safetensors."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: no weight_map")
        out = {}
        for key, shard in weight_map.items():
            p = Path(shard)
            if p.is_absolute() or ".." in p.parts or len(p.parts) != 1:
                raise CheckpointError(f"{index}: shard name {shard!r} for {key!r} is not a plain file name")
            if not (folder / p).exists():
                raise CheckpointError(f"missing shard {folder / p} (listed for {key!r} in {index.name})")
            out[key] = folder / p
        return out
    single = folder / "model.safetensors"
    if not single.exists():
        raise CheckpointError(f"{folder}: no model.safetensors or model.safetensors.index.json")
    def keys():
        with safe_open(single, framework="pt") as f:
            return {k: single for k in f.keys()}

    return safetensors_file(single, "reading the header", keys)


def load_model(path: str | Path, dtype: str | None = None, device: str | torch.device = "cpu",
               tp=None, quantize: str | None = None, linear_kernel: str | None = None) -> tuple[DiffusionLM, dict]:
    """Load the model in `path`; returns (model in eval mode, raw config.json dict). With `tp`
    (unmask.layers.parallel.TensorParallel) this rank's shard: only its slices are read. With
    `quantize` ("int8", CPU, float32): its linear layers in int8 (unmask.layers.quant), each weight
    quantized as it is read, so no float copy of the model is ever whole. `linear_kernel` (float32
    on CPU; default: env UNMASK_LINEAR_KERNEL, else "auto"): unmask.layers.dispatch."""
    folder = Path(path)
    source = None
    if is_gguf(folder):  # llama.cpp's single-file format (unmask.models.gguf)
        source = GGUFFile(folder)
        if tp is not None:
            raise CheckpointError(f"{folder}: tensor parallelism reads safetensors shards; a GGUF file runs in one "
                                  "process")
    elif not folder.is_dir():
        inside = file_inside_file(folder)
        what = ("is a file" if folder.exists() else "does not exist"
                + (f" ({inside} is a file)" if inside is not None else ""))
        raise CheckpointError(f"model folder {folder} {what}; a model is a checkpoint folder (config.json, "
                              "safetensors, tokenizer files), a GGUF file or an embedded model's name")
    cfg = source.config() if source is not None else read_json(folder / "config.json")
    family = resolve_family(cfg)
    arch = family.arch_of(cfg, folder)
    device = torch.device(device)
    torch_dtype = resolve_dtype(dtype, device)
    files = {} if source is not None else {k: f for k, f in weight_files(folder).items()
                                           if not k.endswith(_IGNORED_SUFFIXES)}
    if family.skipped is not None:
        reasons = {k: family.skipped(k) for k in files}
        files = {k: f for k, f in files.items() if reasons[k] is None}
        vision = sum(r == "vision" for r in reasons.values())
        if vision:
            warnings.warn(f"{folder}: {vision} vision-tower tensors skipped: unmask runs this model on text only "
                          "(image input is not supported)", UnmaskWarning, stacklevel=2)
    if source is None and arch.num_layers > len(files):  # each layer has weights: refuse before building a huge module
        raise CheckpointError(f"{folder}: config.json says {arch.num_layers} layers, but the checkpoint holds only "
                              f"{len(files)} tensors")
    try:
        with torch.device("meta"), _no_init():
            model = family.cls(arch)
    except (RuntimeError, OverflowError, ValueError) as e:  # sizes no tensor can have
        raise CheckpointError(f"{folder}: config.json describes tensors that cannot be built (hidden size "
                              f"{arch.hidden_size}, {arch.num_heads} heads, intermediate size {arch.intermediate_size}, "
                              f"vocabulary {arch.vocab_size}): {e}") from None
    if source is not None:  # the release's names, found in the file by llama.cpp's table
        names = source.names(list(model.state_dict()), arch.num_layers)
        left = source.unmapped(names)
        if left:
            raise CheckpointError(f"{folder}: tensors unmask's {family.name} model has no place for: {few(left)}")
        files = {k: folder for k in names}
        source.release_names = names
    kernel = check_linear_kernel(linear_kernel)
    lean: list[str] = []
    head = model.parts()[3] if hasattr(model, "parts") else None  # a tied head: none
    on_cpu = device.type == "cpu"
    pair = None
    if quantize is not None:
        from unmask.layers.quant import ends, small_ends, targets

        check_quantize(quantize, device, torch_dtype)
        if on_cpu:
            lean = targets(model, head)
            pair = ends(model) if small_ends(quantize) and tp is None else None  # int4: embedding and head in int8
            lean += list(pair or ())
    model = fill(model, folder, files, device, torch_dtype, tp, lean,
                  kernel if device.type == "cpu" and torch_dtype == torch.float32 else "default", source, cfg,
                  quantize or "int8", pair)
    if quantize is not None and on_cpu:
        from unmask.layers.quant import quantize_experts

        quantize_experts(model)  # expert weights not quantized as read (a module without checkpoint_parts)
    elif quantize is not None:  # a GPU: torchao, in place, layer by layer
        from unmask.layers.torchao_quant import quantize_torchao

        quantize_torchao(model, quantize, model.parts()[3] if hasattr(model, "parts") else None)
    use_linear_kernel(model, kernel, device, torch_dtype)
    return model, cfg


@contextlib.contextmanager
def _no_init():
    """Modules built on the meta device without running their initialisers: every weight is
    assigned from the checkpoint, and a meta tensor's random init goes through PyTorch's Python
    reference ops, whose first use imports torch._dynamo (1.5 s of a start-up here)."""
    names = [n for n in dir(nn.init) if n.endswith("_") and not n.startswith("_")]
    saved = {n: getattr(nn.init, n) for n in names}
    try:
        for n in names:
            setattr(nn.init, n, lambda tensor, *a, **k: tensor)
        yield
    finally:
        for n, f in saved.items():
            setattr(nn.init, n, f)


def check_linear_kernel(kernel: str | None) -> str:
    """`kernel`, or the environment's UNMASK_LINEAR_KERNEL, or "auto"; an UnmaskError for another name."""
    from unmask.layers.dispatch import KERNELS

    name = kernel if kernel is not None else os.environ.get("UNMASK_LINEAR_KERNEL") or "auto"
    if name not in KERNELS:
        where = "linear_kernel" if kernel is not None else "UNMASK_LINEAR_KERNEL"
        raise UnmaskError(f"{where} {name!r} is not a linear kernel; choose {', '.join(KERNELS)}", param="linear_kernel")
    return name


def use_linear_kernel(model, kernel: str, device, dtype) -> int:
    """The float32 CPU linear layers of a loaded `model` on `kernel` (unmask.layers.dispatch)."""
    if torch.device(device).type != "cpu" or dtype != torch.float32:
        return 0
    from unmask.layers.dispatch import use_kernels

    return use_kernels(model, kernel)


def check_quantize(quantize, device, dtype) -> None:
    """Whether `quantize` runs here, or an UnmaskError naming why."""
    from unmask.layers.quant import QUANTIZE
    from unmask.layers.torchao_quant import GPU_METHODS

    device = torch.device(device)
    if quantize not in QUANTIZE + GPU_METHODS:
        raise UnmaskError(f"quantize {quantize!r} is not a quantization; choose int8 (CPU or GPU), int4 (CPU) or "
                          "fp8 (GPU)", param="quantize")
    if device.type == "cpu":
        if quantize not in QUANTIZE:
            raise UnmaskError(f"quantize {quantize}: on CPU unmask quantizes to {', '.join(QUANTIZE)}; "
                              f"{quantize} runs on a GPU", param="quantize")
        if dtype != torch.float32:
            raise UnmaskError(f"quantize {quantize}: the {quantize} kernels take float32 activations; dtype "
                              f"{str(dtype).replace('torch.', '')} does not combine with it", param="quantize")
        if quantize == "int4":
            from unmask.layers.int4 import kernel

            kernel()  # built once per machine; an UnmaskError naming what is missing
        return
    if quantize == "int4":
        raise UnmaskError(f"quantize int4 runs on CPU (unmask's kernel), not on {device}; on a GPU choose int8 or fp8",
                          param="quantize")
    if device.type != "cuda":
        raise UnmaskError(f"quantize {quantize}: runs on CPU (FBGEMM) or CUDA (torchao), not on {device}",
                          param="quantize")
    try:
        import torchao  # noqa: F401
    except ImportError:
        raise UnmaskError(f"quantize {quantize} on {device} uses torchao, which is not installed here: "
                          "pip install torchao", param="quantize") from None
    if quantize == "fp8" and torch.cuda.get_device_capability(device) < (8, 9):
        raise UnmaskError(f"quantize fp8 needs float8 tensor cores (compute capability 8.9+); "
                          f"{torch.cuda.get_device_name(device)} has {torch.cuda.get_device_capability(device)}",
                          param="quantize")


def load_drafter(path: str | Path, dtype: str | None = None, device: str | torch.device = "cpu",
                 linear_kernel: str | None = None):
    """A DFlash drafter folder (unmask.models.dflash, the released layout) -> (DFlashDrafter in eval
    mode, raw config.json), strictly: every weight present, none unexpected, shapes checked."""
    from unmask.models.dflash import DFlashDrafter, dflash_config

    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointError(f"drafter folder {folder} does not exist or is not a folder")
    cfg = read_json(folder / "config.json")
    c = dflash_config(cfg)
    device = torch.device(device)
    torch_dtype = resolve_dtype(dtype, device)
    files = {k: f for k, f in weight_files(folder).items() if not k.endswith(_IGNORED_SUFFIXES)}
    with torch.device("meta"), _no_init():
        model = DFlashDrafter(c)
    model = fill(model, folder, files, device, torch_dtype)
    use_linear_kernel(model, check_linear_kernel(linear_kernel), device, torch_dtype)
    return model, cfg


def check_split(path: str | Path, world: int) -> None:
    """Whether the model in `path` splits over `world` ranks (its config only), or an error naming why."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        return  # load_model names the problem
    cfg = read_json(folder / "config.json")
    check_divisible(resolve_family(cfg).arch_of(cfg, folder), world)
