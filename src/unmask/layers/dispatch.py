"""float32 linear layers on CPU through the faster of two maintained kernels, chosen per shape by
measurement (`--linear-kernel`, `LLM(..., linear_kernel=...)`, env UNMASK_LINEAR_KERNEL).

A denoising step multiplies G positions (8-32 per row, times the batch) by every weight, and on a
CPU the roofline says that costs about one read of the weights whatever G. PyTorch's default
float32 linear does not behave so on every CPU: on the AMD machine of `benchmarks/linear_kernels.py`
a 4096x12288 layer took 9 ms at 1 row, 18 ms at 2 and 26 ms at 8 (MKL's skinny path), where
oneDNN's inner product over a weight reordered once (`torch.ops.mkldnn._reorder_linear_weight` /
`_linear_pointwise`, the kernels torch.compile's CPU freezing path calls) took 5.4 / 5.6 / 7.4 ms.
For tiny layers at one row the default is faster (oneDNN's call overhead is tens of microseconds).

So each distinct (in, out) shape is measured once per machine on the layer's own weight: both
kernels at 1, 2, 4, ..., 64 rows, interleaved, best of several. oneDNN takes a layer from the
smallest row count at which it is faster at that count and every larger one; a layer where it
never is stays an nn.Linear. The choice (with the times) is recorded in a JSON file keyed by CPU,
thread count and torch version (`$UNMASK_CACHE_DIR` or ~/.cache/unmask/linear_kernels.json), so
later loads on that machine choose the same without measuring (a large weight that oneDNN takes
only from some row count goes to oneDNN at every count: KEEP_PLAIN_BYTES). Kernels: "auto" (that),
"default" (PyTorch's F.linear, no change), "onednn" (oneDNN at every row count).
"""

import contextlib
import json
import os
import platform
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from unmask.errors import UnmaskWarning

KERNELS = ("auto", "default", "onednn")
PROBE_ROWS = (1, 2, 4, 8, 16, 32, 64)
NEVER = 1 << 62  # from_rows of a layer that stays on the default kernel
# A layer oneDNN takes only from some row count keeps its plain weight beside the reordered one
# for the fewer-row calls: for a large weight that doubles its memory (an 8B model's linear
# layers, 28 GB, would be held twice), so above this size oneDNN takes every row count. The cost,
# measured here: a 4096x12288 layer at one row 11.5 ms on oneDNN against 7.5 on the default at 1
# thread (2 threads: 6.1 against 7.9, oneDNN faster anyway).
KEEP_PLAIN_BYTES = 32 << 20
BLOCK_BYTES = 512 << 20  # a weight larger than this is reordered (and multiplied) in blocks of rows (at 256 MB the
# blocks cost an 8B head ~8 % at one row; at 512 MB nothing measurable)


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


class OneDNNLinear(nn.Module):
    """nn.Linear's forward through oneDNN over a once-reordered weight, for inputs of at least
    `from_rows` rows; fewer rows go through F.linear on the plain weight (kept only then)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, from_rows: int = 1) -> None:
        super().__init__()
        w = weight.detach()
        self.in_features, self.out_features, self.from_rows = w.shape[1], w.shape[0], from_rows
        # a large weight (an 8B model's 2 GB head) is reordered in blocks of output rows: the
        # reorder's own copies are one block's, not the whole weight's (lean loading)
        step = max(1, BLOCK_BYTES // (4 * w.shape[1]))
        self._blocks = [torch.ops.mkldnn._reorder_linear_weight(w[i : i + step], None)
                        for i in range(0, w.shape[0], step)]
        self.register_buffer("weight", w if from_rows > 1 else None, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach(), persistent=False)
        self._plain: torch.Tensor | None = None

    def dense_weight(self) -> torch.Tensor:
        """The plain (out, in) weight: the kept one, or the reordered blocks read back (a copy;
        the reorder changes the layout, not the values)."""
        return self.weight if self.weight is not None else torch.cat([b.to_dense() for b in self._blocks])

    @property
    def packed_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._blocks)

    @classmethod
    def from_linear(cls, linear: nn.Linear, from_rows: int = 1) -> "OneDNNLinear":
        out = cls(linear.weight, linear.bias, from_rows)
        out._forward_hooks.update(linear._forward_hooks)  # e.g. a row-parallel all-reduce
        return out

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        """The checkpoint's names and plain layout (the reordered weight read back: a copy)."""
        destination[prefix + "weight"] = self.dense_weight()
        if self.bias is not None:
            destination[prefix + "bias"] = self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() == 0:  # no rows (logits asked at no position): the reordered weight alone can't say
            return x.new_empty(*x.shape[:-1], self.out_features)
        if self._plain is not None:  # inside default_numerics: PyTorch's kernel on the plain weight
            return F.linear(x, self._plain, self.bias)
        if x.numel() >= self.from_rows * self.in_features:
            with torch.no_grad():  # inference only: no gradient flows through the reordered weight
                if len(self._blocks) == 1:
                    return torch.ops.mkldnn._linear_pointwise(x, self._blocks[0], self.bias, "none", [], "")
                y = torch.cat([torch.ops.mkldnn._linear_pointwise(x, b, None, "none", [], "") for b in self._blocks], -1)
                return y if self.bias is None else y.add_(self.bias)
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN from {self.from_rows} rows"


def machine_key() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu} | {torch.get_num_threads()} threads | torch {torch.__version__}"


def cache_path() -> Path:
    base = os.environ.get("UNMASK_CACHE_DIR") or Path.home() / ".cache" / "unmask"
    return Path(base) / "linear_kernels.json"


def _valid_entry(entry) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("from_rows"), int)
            and not isinstance(entry.get("from_rows"), bool) and entry["from_rows"] >= 1)


def _read_cache() -> dict:
    """The machine's record; a damaged one (not JSON, or an entry of the wrong shape) is a cache,
    not an input: it is measured again and rewritten, with a warning naming the file."""
    path = cache_path()
    try:
        text = path.read_text()
    except OSError:
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    ok = isinstance(data, dict) and all(isinstance(known, dict) and all(_valid_entry(e) for e in known.values())
                                        for known in data.values())
    if not ok:
        warnings.warn(f"the linear-kernel cache {path} is damaged (not the record unmask writes); its kernels are "
                      "measured again and the file rewritten", UnmaskWarning, stacklevel=2)
        return {}
    return data


def _write_cache(data: dict) -> None:
    path = cache_path()
    try:  # a cache: a machine where it cannot be written measures again next time
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass


def _best(fn, budget: float = 0.05, least: int = 3) -> float:
    fn()
    times, spent = [], 0.0
    while len(times) < least or spent < budget and len(times) < 20:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        spent += times[-1]
    return min(times)


@torch.no_grad()
def measure(weight: torch.Tensor, rows=PROBE_ROWS) -> dict:
    """Both kernels on `weight` at each row count: {"rows": [...], "default_ms": [...], "onednn_ms": [...],
    "from_rows": n} (NEVER when oneDNN is not faster at the largest count)."""
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
    default, onednn = [], []
    for m in rows:
        x = torch.randn(m, weight.shape[1])
        a = b = float("inf")
        for _ in range(2):  # interleaved: a drift of the machine's speed hits both
            a = min(a, _best(lambda: F.linear(x, weight)))
            b = min(b, _best(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")))
        default.append(round(a * 1e3, 4))
        onednn.append(round(b * 1e3, 4))
    return {"rows": list(rows), "default_ms": default, "onednn_ms": onednn,
            "from_rows": crossover(rows, default, onednn)}


def crossover(rows, default, onednn) -> int:
    """The smallest of `rows` from which oneDNN's times are below the default's at every larger
    count too; NEVER when it is not below at the largest."""
    from_rows = NEVER
    for m, a, b in reversed(list(zip(rows, default, onednn))):
        if b >= a:
            break
        from_rows = m
    return from_rows


def routers(name: str) -> bool:
    """Linear layers whose weight the model reads directly (mixture-of-experts routers): left as they are."""
    return name.rsplit(".", 1)[-1] == "gate" or name.endswith("router.proj")


def replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)


def _targets(model: nn.Module, skip) -> list:
    return [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear) and not skip(name)
            and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"]


def plan_for(weight: torch.Tensor) -> int:
    """from_rows for a float32 weight of this shape: this machine's record, or measured on it now
    (and recorded); 1 for a weight over KEEP_PLAIN_BYTES that oneDNN takes from more rows (never
    held twice: below)."""
    data = _read_cache()
    known = data.setdefault(machine_key(), {})
    tag = f"{weight.shape[1]}x{weight.shape[0]}"
    if tag not in known:
        known[tag] = measure(weight.detach())
        _write_cache(data)
    from_rows = int(known[tag]["from_rows"])
    return 1 if 1 < from_rows < NEVER and 4 * weight.numel() > KEEP_PLAIN_BYTES else from_rows


def choices(model: nn.Module, skip=routers) -> dict:
    """{(in, out): from_rows} for the float32 nn.Linear layers of `model`, from the machine's record,
    measuring (and recording) the shapes it lacks."""
    out = {}
    for _, m in _targets(model, skip):
        shape = (m.in_features, m.out_features)
        if shape not in out:
            out[shape] = plan_for(m.weight)
    return out


def use_kernels(model: nn.Module, kernel: str = "auto", skip=routers) -> int:
    """Put `model`'s float32 CPU nn.Linear layers (but those whose name `skip` accepts) on `kernel`, in
    place; returns how many now run through oneDNN. Inference only: the reordered weight has no
    gradient."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown linear kernel {kernel!r}; choose {', '.join(KERNELS)}")
    if kernel == "default" or not onednn_available():
        return 0
    plan = {} if kernel == "onednn" else choices(model, skip)
    targets = [(name, m) for name, m in _targets(model, skip) if plan.get((m.in_features, m.out_features), 1) < NEVER]
    for name, m in targets:
        replace(model, name, OneDNNLinear.from_linear(m, plan.get((m.in_features, m.out_features), 1)))
        m.weight = None
    return len(targets)


@contextlib.contextmanager
def default_numerics(model: nn.Module):
    """Within it, every oneDNN layer of `model` computes with PyTorch's default kernel on its plain
    weight, so the model's outputs are those of a model loaded with kernel "default" (a reference
    mode promises the reference's tokens, and the two kernels round differently). A layer whose
    plain weight was not kept holds a read-back copy for the duration (freed on exit)."""
    layers = [m for m in model.modules() if isinstance(m, OneDNNLinear)]
    try:
        for m in layers:
            m._plain = m.dense_weight()
        yield model
    finally:
        for m in layers:
            m._plain = None
