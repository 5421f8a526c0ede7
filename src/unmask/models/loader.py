"""Strict loader for a local Hugging Face checkpoint folder (single or sharded safetensors).

The module is built on the meta device and the checkpoint tensors are assigned to it, so the
weights are held in memory once. Any missing file, unknown architecture, missing or unexpected
key, or shape mismatch is a CheckpointError that names it.
"""

import json
import warnings
from pathlib import Path

import torch
from safetensors import safe_open

from unmask.errors import CheckpointError, UnmaskError, UnmaskWarning
from unmask.files import file_inside_file
from unmask.models.base import DiffusionLM
from unmask.models.parallel import ZERO, check_divisible, read_slice, shard_model
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


def _safetensors(path: Path, what: str, fn):
    """Run fn() over a safetensors file; any failure of the file is a CheckpointError naming it."""
    try:
        return fn()
    except CheckpointError:
        raise
    except Exception as e:  # safetensors raises its own SafetensorError, OSError or RuntimeError on damage
        raise CheckpointError(f"{path} is damaged or not a safetensors file ({what}: {e})") from None


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

    return _safetensors(single, "reading the header", keys)


def load_model(path: str | Path, dtype: str | None = None, device: str | torch.device = "cpu",
               tp=None, quantize: str | None = None) -> tuple[DiffusionLM, dict]:
    """Load the model in `path`; returns (model in eval mode, raw config.json dict). With `tp`
    (unmask.layers.parallel.TensorParallel) this rank's shard: only its slices are read. With
    `quantize` ("int8", CPU, float32): its linear layers in int8 (unmask.layers.quant)."""
    folder = Path(path)
    if not folder.is_dir():
        inside = file_inside_file(folder)
        what = ("is a file" if folder.exists() else "does not exist"
                + (f" ({inside} is a file)" if inside is not None else ""))
        raise CheckpointError(f"model folder {folder} {what}; a model is a checkpoint folder (config.json, "
                              "safetensors, tokenizer files) or an embedded model's name")
    cfg = read_json(folder / "config.json")
    family = resolve_family(cfg)
    arch = family.arch(cfg)
    device = torch.device(device)
    torch_dtype = resolve_dtype(dtype, device)
    files = {k: f for k, f in weight_files(folder).items() if not k.endswith(_IGNORED_SUFFIXES)}
    if family.skipped is not None:
        reasons = {k: family.skipped(k) for k in files}
        files = {k: f for k, f in files.items() if reasons[k] is None}
        vision = sum(r == "vision" for r in reasons.values())
        if vision:
            warnings.warn(f"{folder}: {vision} vision-tower tensors skipped: unmask runs this model on text only "
                          "(image input is not supported)", UnmaskWarning, stacklevel=2)
    if arch.num_layers > len(files):  # each layer has weights: refuse before building a huge module
        raise CheckpointError(f"{folder}: config.json says {arch.num_layers} layers, but the checkpoint holds only "
                              f"{len(files)} tensors")
    try:
        with torch.device("meta"):
            model = family.cls(arch)
    except (RuntimeError, OverflowError, ValueError) as e:  # sizes no tensor can have
        raise CheckpointError(f"{folder}: config.json describes tensors that cannot be built (hidden size "
                              f"{arch.hidden_size}, {arch.num_heads} heads, intermediate size {arch.intermediate_size}, "
                              f"vocabulary {arch.vocab_size}): {e}") from None
    if quantize is not None:
        check_quantize(quantize, device, torch_dtype)
    model = _fill(model, folder, files, device, torch_dtype, tp)
    if quantize is not None:
        from unmask.layers.quant import quantize_model

        quantize_model(model, quantize, model.parts()[3] if hasattr(model, "parts") else None)  # a tied head: none
    return model, cfg


def check_quantize(quantize, device, dtype) -> None:
    """Whether `quantize` runs here, or an UnmaskError naming why."""
    from unmask.layers.quant import QUANTIZE

    if quantize not in QUANTIZE:
        raise UnmaskError(f"quantize {quantize!r} is not a quantization; choose {', '.join(QUANTIZE)}", param="quantize")
    if torch.device(device).type != "cpu":
        raise UnmaskError(f"quantize {quantize}: int8 layers run on CPU (PyTorch's FBGEMM kernels); on {device} "
                          "they are not built yet", param="quantize")
    if dtype != torch.float32:
        raise UnmaskError(f"quantize {quantize}: the int8 kernels take float32 activations; dtype "
                          f"{str(dtype).replace('torch.', '')} does not combine with it", param="quantize")


def _fill(model, folder: Path, files: dict, device, dtype, tp=None):
    """Strictly fill a meta-device `model` from the checkpoint `files` (name -> shard): every weight
    present, none unexpected, shapes checked; with `tp` only this rank's slices are read."""
    expected = {k: v.shape for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(files))
    unexpected = sorted(set(files) - set(expected))
    if missing:
        raise CheckpointError(f"{folder}: missing weights {_few(missing)}")
    if unexpected:
        raise CheckpointError(f"{folder}: unexpected weights {_few(unexpected)}")
    specs: dict = {}
    if tp is not None:  # this rank's shapes; weights other ranks hold (their experts) are not read
        specs = shard_model(model, tp)
        local = set(model.state_dict())
        files = {k: f for k, f in files.items() if k in local}
    state = {}
    by_file: dict[Path, list[str]] = {}
    for k, f in files.items():
        by_file.setdefault(f, []).append(k)
    for f, keys in by_file.items():
        _safetensors(f, "reading tensors", lambda f=f, keys=keys: _read_shard(f, keys, expected, state, device,
                                                                              dtype, specs))
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval()


def load_drafter(path: str | Path, dtype: str | None = None, device: str | torch.device = "cpu"):
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
    with torch.device("meta"):
        model = DFlashDrafter(c)
    return _fill(model, folder, files, device, torch_dtype), cfg


def check_split(path: str | Path, world: int) -> None:
    """Whether the model in `path` splits over `world` ranks (its config only), or an error naming why."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        return  # load_model names the problem
    cfg = read_json(folder / "config.json")
    check_divisible(resolve_family(cfg).arch(cfg), world)


def _read_shard(f: Path, keys: list[str], expected: dict, state: dict, device, dtype, specs: dict) -> None:
    with safe_open(f, framework="pt", device="cpu") as sf:
        present = set(sf.keys())
        for k in keys:
            if k not in present:
                raise CheckpointError(f"{f} does not contain weight {k!r} that the index lists")
            sl = sf.get_slice(k)
            shape = tuple(sl.get_shape())
            if shape != tuple(expected[k]):
                raise CheckpointError(f"{f}: weight {k!r} has shape {shape}, expected {tuple(expected[k])}")
            spec = specs.get(k)
            t = sf.get_tensor(k) if spec is None else torch.zeros(shape) if spec is ZERO else read_slice(sl, spec)
            if not (t.is_floating_point() or t.is_complex()):
                raise CheckpointError(f"{f}: weight {k!r} has dtype {t.dtype}, not a floating-point type")
            if not bool(torch.isfinite(t).all()):
                raise CheckpointError(f"{f}: weight {k!r} holds NaN or infinite values (a damaged file?)")
            state[k] = t.to(device=device, dtype=dtype)


def _few(keys: list[str], n: int = 5) -> str:
    more = f" (and {len(keys) - n} more)" if len(keys) > n else ""
    return ", ".join(keys[:n]) + more
