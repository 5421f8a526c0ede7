"""Reading a checkpoint's tensors into their final form (unmask.models.loader decides what to
build and by which rules; this fills it).

A meta-device model is filled strictly (every weight present, none unexpected, shapes checked):
a safetensors tensor already in the model's dtype on the CPU is the shard's own pages, mapped
copy-on-write (`Mapped`: nothing copied at load, the page cache shared with other processes;
one that moves to oneDNN gives its pages back once reordered); any other is read in chunks of
whole rows by plain file reads, each chunk checked finite and converted into the final tensor
(float32 from bf16, or int8 / int4 quantized as read, `convert`), so a load never holds a tensor
twice; GGUF tensors are dequantized one at a time (a Q4_0 or Q4_K tensor kept as stored under int4).
Tensor parallelism reads only this rank's slices.
"""

import json
import math
import mmap
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from unmask.errors import CheckpointError
from unmask.layers.dispatch import replace
from unmask.layers.int4 import quantize_groups
from unmask.layers.quant import quantize_rows
from unmask.models.parallel import ZERO, read_slice, shard_model


def safetensors_file(path: Path, what: str, fn):
    """Run fn() over a safetensors file; any failure of the file is a CheckpointError naming it."""
    try:
        return fn()
    except CheckpointError:
        raise
    except Exception as e:  # safetensors raises its own SafetensorError, OSError or RuntimeError on damage
        raise CheckpointError(f"{path} is damaged or not a safetensors file ({what}: {e})") from None


def fill(model, folder: Path, files: dict, device, dtype, tp=None, int8: list[str] = (), kernel: str = "default",
          source=None, cfg: dict | None = None, method: str = "int8", ends: tuple[str, str] | None = None):
    """Strictly fill a meta-device `model` from the checkpoint `files` (name -> shard): every weight
    present, none unexpected, shapes checked; with `tp` only this rank's slices are read. The linear
    layers named in `int8` are quantized weight by weight as they are read, to `method` (int8:
    unmask.layers.quant; int4: unmask.layers.int4, a GGUF Q4_0 / Q4_K tensor taken as it is stored, a
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
        raise CheckpointError(f"{folder}: missing weights {few(missing)}")
    if unexpected:
        raise CheckpointError(f"{folder}: unexpected weights {few(unexpected)}")
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
            nibbles, scales[, offsets]) (row chunks quantized as read, a GGUF Q4_0 / Q4_K tensor as
            stored)."""
            if k not in names and k not in experts:
                return False
            if t is None:
                four = method == "int4" and k not in experts and names.get(k) not in int8_only
                return "int4" if four and expected[k][-1] % GROUP == 0 else "int8"
            if embedding is not None and names.get(k) == embedding:
                quantized[embedding] = Int8Embedding(*t) if isinstance(t, tuple) else Int8Embedding.from_weight(t)
            elif k in experts:
                expert_rows[k] = t if isinstance(t, tuple) else quantize_rows(t.reshape(-1, t.shape[-1]))
            elif isinstance(t, tuple) and t[0] == "int4":  # (nibbles, scales[, offsets])
                quantized[names[k]] = Int4Linear(t[1], t[2], offsets=t[3] if len(t) > 3 else None)
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
        safetensors_file(f, "reading tensors", lambda f=f, keys=keys: _read_shard(f, keys, expected, state, device,
                                                                              dtype, specs, convert, adopt))
    for name, q in reordered.items():
        like = model.get_submodule(name)
        bias = state.pop(f"{name}.bias", None)
        q.bias = None if bias is None else bias
        q._forward_hooks.update(like._forward_hooks)
        replace(model, name, q)
    for name, q in quantized.items():
        like = model.get_submodule(name)
        if hasattr(q, "bias"):  # (a linear layer; an embedding has none)
            bias = state.pop(f"{name}.bias", None)
            q.bias = None if bias is None else bias.float()
        q._forward_hooks.update(like._forward_hooks)  # e.g. a row-parallel all-reduce
        replace(model, name, q)
    if int8 and experts:
        install_experts(model, experts, expert_rows)
    result = model.load_state_dict(state, strict=not (quantized or reordered or int8), assign=True)
    if result.missing_keys or result.unexpected_keys:  # the names were checked above: a bug, said plainly
        raise CheckpointError(f"{folder}: weights left unplaced {few(result.missing_keys + result.unexpected_keys)}")
    return model.eval()


_FLOATS = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
CHUNK_BYTES = 16 << 20  # rows are read, checked and converted this many source bytes at a time


class Mapped:
    """A shard mapped copy-on-write (a private mapping: a weight written in place changes this
    process's copy of its page, never the file): tensors that are views of its pages, and their
    pages given back (`release`) when a tensor was copied elsewhere (a oneDNN reorder). The
    mapping lives as long as a tensor made from it."""

    def __init__(self, fh) -> None:
        self.mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)

    def tensor(self, f: Path, k: str, offset: int, nbytes: int, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        count = math.prod(shape)
        if count * dtype.itemsize != nbytes:
            raise CheckpointError(f"{f}: weight {k!r} holds {nbytes} bytes, not a {dtype} tensor of shape {shape}")
        if offset + nbytes > len(self.mm):
            raise CheckpointError(f"{f} is truncated: weight {k!r} ends past the end of the file")
        return torch.frombuffer(self.mm, dtype=dtype, count=count, offset=offset).view(shape)

    def release(self, offset: int, nbytes: int) -> None:
        """Give back the pages of [offset, offset + nbytes) (`drop_pages`)."""
        drop_pages(self.mm, offset, nbytes)


def drop_pages(mm: mmap.mmap, offset: int, nbytes: int) -> None:
    """Drop the pages of [offset, offset + nbytes) of a file mapping from this process: clean pages
    (nothing written to them), so the page cache keeps them and a later touch reads them again."""
    lo = offset // mmap.PAGESIZE * mmap.PAGESIZE
    try:
        mm.madvise(mmap.MADV_DONTNEED, lo, min(offset + nbytes, len(mm)) - lo)
    except (OSError, ValueError, AttributeError):  # a platform without it: the pages are simply kept
        pass


def _read_shard(f: Path, keys: list[str], expected: dict, state: dict, device, dtype, specs: dict,
                convert=None, adopt=None) -> None:
    """Read `keys` of shard `f` into `state` (or, for the weights `convert` takes, into it): a
    tensor already in `dtype` on the CPU as a view of the shard's pages (`Mapped`), any other
    whole in chunks of rows by plain reads, each chunk converted into the final tensor, so a load
    never holds a tensor twice; this rank's slices (`specs`) through safetensors."""
    with safe_open(f, framework="pt", device="cpu") as sf:
        present = set(sf.keys())
        base, header = _header(f)
        mapped = None
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
                if _FLOATS[kind] == dtype and torch.device(device).type == "cpu" and math.prod(shape) > 0 and \
                        (base + begin) % dtype.itemsize == 0:  # the shard's own pages
                    mapped = mapped or Mapped(fh)
                    out = mapped.tensor(f, k, base + begin, end - begin, shape, dtype)
                    _check_finite(f, k, out)
                    if adopt is None or not adopt(k, out):
                        state[k] = out
                    else:  # reordered into memory of its own: its pages go back
                        mapped.release(base + begin, end - begin)
                    del out
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
        if convert is not None and convert(k, None) == "int4" and source.keeps_int4(source.release_names[k]):
            convert(k, ("int4", *source.read_int4(source.release_names[k], cfg)))  # kept as stored
            continue
        t = source.read(source.release_names[k], k, cfg, mapped=dtype == torch.float32 and
                        torch.device(device).type == "cpu")
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
        else:  # reordered into memory of its own: a mapped tensor's pages go back
            source.release(source.release_names[k])


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


def few(keys: list[str], n: int = 5) -> str:
    more = f" (and {len(keys) - n} more)" if len(keys) > n else ""
    return ", ".join(keys[:n]) + more
