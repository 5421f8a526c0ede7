"""Strict loader for a local Hugging Face checkpoint folder (single or sharded safetensors).

The module is built on the meta device and the checkpoint tensors are assigned to it, so the
weights are held in memory once. Any missing file, unknown architecture, missing or unexpected
key, or shape mismatch is a CheckpointError that names it.
"""

import contextlib
import json
import math
import os
import warnings
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from unmask.errors import CheckpointError, UnmaskError, UnmaskWarning
from unmask.layers.dispatch import replace
from unmask.layers.int4 import quantize_groups
from unmask.layers.quant import quantize_rows
from unmask.files import file_inside_file
from unmask.models.base import DiffusionLM
from unmask.models.gguf import GGUFFile, is_gguf
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
            raise CheckpointError(f"{folder}: tensors unmask's {family.name} model has no place for: {_few(left)}")
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
    model = _fill(model, folder, files, device, torch_dtype, tp, lean,
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


def _fill(model, folder: Path, files: dict, device, dtype, tp=None, int8: list[str] = (), kernel: str = "default",
          source=None, cfg: dict | None = None, method: str = "int8", ends: tuple[str, str] | None = None):
    """Strictly fill a meta-device `model` from the checkpoint `files` (name -> shard): every weight
    present, none unexpected, shapes checked; with `tp` only this rank's slices are read. The linear
    layers named in `int8` are quantized weight by weight as they are read, to `method` (int8:
    unmask.layers.quant; int4: unmask.layers.int4, a GGUF Q4_0 tensor taken as it is stored, a
    layer whose inputs are not in groups of 32 and mixture-of-experts weights int8; `ends`, the token
    embedding's and the head's names when they are among them: both int8, the embedding an
    Int8Embedding);
    with `kernel` "auto" or "onednn" (float32 on CPU) the others move to oneDNN as each is read
    (unmask.layers.dispatch), those first, so the one extra copy a reorder makes comes while
    little else is resident."""
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
    quantized: dict = {}
    convert = None
    if int8:
        from unmask.layers.int4 import GROUP, Int4Linear
        from unmask.layers.quant import Int8Embedding, Int8Linear, expert_parts, install_experts, trim_heap

        embedding, int8_only = (ends[0], set(ends)) if ends else (None, set())

        names = {f"{n}.weight": n for n in int8}
        experts = {k: v for k, v in expert_parts(model).items() if k in files}
        expert_rows: dict = {}

        def convert(k, t):
            """Weight `k`'s storage when asked (t None): "int8", "int4" or False (not quantized);
            else takes t: a float tensor (a slice, a GGUF tensor), (int8 rows, scales) or ("int4",
            nibbles, scales) (row chunks quantized as read, a GGUF Q4_0 tensor as stored)."""
            if k not in names and k not in experts:
                return False
            if t is None:
                four = method == "int4" and k not in experts and names.get(k) not in int8_only
                return "int4" if four and expected[k][-1] % GROUP == 0 else "int8"
            if embedding is not None and names.get(k) == embedding:
                quantized[embedding] = Int8Embedding(*t) if isinstance(t, tuple) else Int8Embedding.from_weight(t)
            elif k in experts:
                expert_rows[k] = t if isinstance(t, tuple) else quantize_rows(t.reshape(-1, t.shape[-1]))
            elif isinstance(t, tuple) and t[0] == "int4":
                quantized[names[k]] = Int4Linear(*t[1:])
            elif convert(k, None) == "int4":
                quantized[names[k]] = Int4Linear.from_weight(t)
            else:
                quantized[names[k]] = (Int8Linear.from_int8(*t, None) if isinstance(t, tuple)
                                       else Int8Linear.from_weight(t, None))
            trim_heap()  # the temporaries' space back to the system, weight by weight (lean)
            return True

    adopt, reordered, plain = None, {}, {}
    if kernel != "default":
        from unmask.layers.dispatch import NEVER, OneDNNLinear, onednn_available, plan_for, routers

        skip = set(int8)
        plain = {f"{n}.weight": n for n, m in model.named_modules()
                 if isinstance(m, nn.Linear) and n not in skip and not routers(n)} if onednn_available() else {}

        def adopt(k, t) -> bool:
            """Whether float weight `k` (read whole) moves to oneDNN now, its plain copy freed."""
            if k not in plain:
                return False
            from_rows = 1 if kernel == "onednn" else plan_for(t)
            if from_rows >= NEVER:
                return False
            reordered[plain[k]] = OneDNNLinear(t, None, from_rows)
            return True

    # reading order: the weights oneDNN reorders first (a reorder holds its plain copy beside the
    # new one: best while little else is resident), then the rest, largest first; runs of keys
    # of one shard each go through one opening of it
    order = sorted(files, key=lambda k: (k not in plain, -math.prod(expected[k])))
    runs: list[tuple[Path, list[str]]] = []
    for k in order:
        if runs and runs[-1][0] == files[k]:
            runs[-1][1].append(k)
        else:
            runs.append((files[k], [k]))
    for f, keys in runs:
        if source is not None:  # a GGUF file (unmask.models.gguf): each tensor dequantized to float32
            _read_gguf(source, cfg, keys, expected, state, device, dtype, convert, adopt)
            continue
        _safetensors(f, "reading tensors", lambda f=f, keys=keys: _read_shard(f, keys, expected, state, device,
                                                                              dtype, specs, convert, adopt))
    for name, q in reordered.items():
        like = model.get_submodule(name)
        bias = state.pop(f"{name}.bias", None)
        q.bias = None if bias is None else bias
        q._forward_hooks.update(like._forward_hooks)
        replace(model, name, q)
    for name, q in quantized.items():
        like = model.get_submodule(name)
        if name != (ends or ("",))[0]:  # (an embedding has no bias)
            bias = state.pop(f"{name}.bias", None)
            q.bias = None if bias is None else bias.float()
        q._forward_hooks.update(like._forward_hooks)  # e.g. a row-parallel all-reduce
        replace(model, name, q)
    if int8 and experts:
        install_experts(model, experts, expert_rows)
    result = model.load_state_dict(state, strict=not (quantized or reordered or int8), assign=True)
    if result.missing_keys or result.unexpected_keys:  # the names were checked above: a bug, said plainly
        raise CheckpointError(f"{folder}: weights left unplaced {_few(result.missing_keys + result.unexpected_keys)}")
    return model.eval()


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
    model = _fill(model, folder, files, device, torch_dtype)
    use_linear_kernel(model, check_linear_kernel(linear_kernel), device, torch_dtype)
    return model, cfg


def check_split(path: str | Path, world: int) -> None:
    """Whether the model in `path` splits over `world` ranks (its config only), or an error naming why."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        return  # load_model names the problem
    cfg = read_json(folder / "config.json")
    check_divisible(resolve_family(cfg).arch_of(cfg, folder), world)


_FLOATS = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
CHUNK_BYTES = 16 << 20  # rows are read, checked and converted this many source bytes at a time


def _read_shard(f: Path, keys: list[str], expected: dict, state: dict, device, dtype, specs: dict,
                convert=None, adopt=None) -> None:
    """Read `keys` of shard `f` into `state` (or, for the weights `convert` takes, into it): whole
    tensors in chunks of rows by plain reads, each chunk converted into the final tensor, so a load
    never holds a tensor twice nor maps a shard's pages into memory; this rank's slices (`specs`)
    through safetensors."""
    with safe_open(f, framework="pt", device="cpu") as sf:
        present = set(sf.keys())
        base, header = _header(f)
        with open(f, "rb") as fh:
            for k in keys:
                if k not in present:
                    raise CheckpointError(f"{f} does not contain weight {k!r} that the index lists")
                sl = sf.get_slice(k)
                shape = tuple(sl.get_shape())
                if shape != tuple(expected[k]):
                    raise CheckpointError(f"{f}: weight {k!r} has shape {shape}, expected {tuple(expected[k])}")
                kind = header[k]["dtype"]
                if kind not in _FLOATS:
                    raise CheckpointError(f"{f}: weight {k!r} has dtype {kind}, not a floating-point type")
                spec = specs.get(k)
                if spec is not None:
                    t = torch.zeros(shape) if spec is ZERO else read_slice(sl, spec)
                    _check_finite(f, k, t)
                    if convert is None or not convert(k, t):
                        t = t.to(device=device, dtype=dtype)
                        if adopt is None or not adopt(k, t):
                            state[k] = t
                    continue
                begin, end = header[k]["data_offsets"]
                how = convert(k, None) if convert is not None else False
                if how:  # int8 / int4: quantized row chunk by row chunk
                    rows2d = (math.prod(shape[:-1]), shape[-1])  # rows of the last dimension (experts stacked)
                    four = how == "int4"
                    q = torch.empty(rows2d, dtype=torch.uint8 if four else torch.int8)
                    scale = torch.empty((rows2d[0], rows2d[1] // 32) if four else rows2d[0],
                                        dtype=torch.float32 if four else torch.float64)

                    def into(i, rows, q=q, scale=scale, quantize=quantize_groups if four else quantize_rows):
                        q[i : i + len(rows)], scale[i : i + len(rows)] = quantize(rows)

                    _read_rows(fh, f, k, base + begin, end - begin, rows2d, _FLOATS[kind], into)
                    convert(k, ("int4", q, scale) if four else (q, scale))
                    del q, scale, into
                    continue
                out = torch.empty(shape, dtype=dtype)
                flat = out.view(shape[0] if shape else 1, -1)

                def into(i, rows, flat=flat):
                    flat[i : i + len(rows)] = rows

                _read_rows(fh, f, k, base + begin, end - begin, shape, _FLOATS[kind], into)
                out = out.to(device)
                if adopt is None or not adopt(k, out):
                    state[k] = out
                del out, flat, into  # an adopted tensor's plain copy goes now, before the next is read


def _read_gguf(source, cfg: dict, keys: list[str], expected: dict, state: dict, device, dtype, convert=None,
               adopt=None) -> None:
    """Read `keys` (the release's names) from a GGUF file into `state` (or `convert` / `adopt`
    them, as _read_shard does), each dequantized to float32 in the release's layout."""
    for k in keys:
        if convert is not None and convert(k, None) == "int4" and source.is_q4_0(source.release_names[k]):
            convert(k, ("int4", *source.read_q4_0(source.release_names[k], cfg)))  # kept as stored
            continue
        t = source.read(source.release_names[k], k, cfg)
        if tuple(t.shape) != tuple(expected[k]):
            raise CheckpointError(f"{source.path}: tensor {source.release_names[k]!r} ({k}) has shape "
                                  f"{tuple(t.shape)}, expected {tuple(expected[k])}")
        _check_finite(source.path, k, t)
        if convert is not None and convert(k, None):  # int8 / int4: quantized from the float tensor
            convert(k, t)
            continue
        t = t.to(device=device, dtype=dtype)
        if adopt is None or not adopt(k, t):
            state[k] = t


def _header(f: Path) -> tuple[int, dict]:
    """(where the data starts, the header) of a safetensors file (safe_open has checked it)."""
    with open(f, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        return 8 + n, json.loads(fh.read(n))


def _read_rows(fh, f: Path, k: str, start: int, nbytes: int, shape: tuple, kind: torch.dtype, into) -> None:
    """Read a tensor's bytes in chunks of whole rows; into(first row, rows) for each, each checked finite."""
    rows = shape[0] if shape else 1
    per_row = (nbytes // rows) if rows else 0
    if rows * per_row != nbytes or per_row % kind.itemsize:
        raise CheckpointError(f"{f}: weight {k!r} holds {nbytes} bytes, not a {kind} tensor of shape {shape}")
    step = max(1, CHUNK_BYTES // max(per_row, 1))
    buf = torch.empty(min(step, rows) * per_row, dtype=torch.uint8)
    fh.seek(start)
    for i in range(0, rows, step):
        n = min(step, rows - i)
        chunk = buf[: n * per_row]
        if fh.readinto(chunk.numpy()) != n * per_row:
            raise CheckpointError(f"{f} is truncated: weight {k!r} ends past the end of the file")
        part = chunk.view(kind).view(n, -1)
        _check_finite(f, k, part)
        into(i, part)


def _check_finite(f: Path, k: str, t: torch.Tensor) -> None:
    if not bool(torch.isfinite(t).all()):
        raise CheckpointError(f"{f}: weight {k!r} holds NaN or infinite values (a damaged file?)")


def _few(keys: list[str], n: int = 5) -> str:
    more = f" (and {len(keys) - n} more)" if len(keys) > n else ""
    return ", ".join(keys[:n]) + more
