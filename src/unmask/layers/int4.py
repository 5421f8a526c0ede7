"""4-bit weights for linear layers on CPU (`--quantize int4`, `LLM(..., quantize="int4")`, and GGUF
files' Q4_0 and Q4_K tensors, their nibbles kept as they are).

Each weight row is cut into groups of 32 inputs, each group 32 signed 4-bit values (-8..7) and a
scale, rounded exactly as llama.cpp's Q4_0 rounds them (scale = the group's value of largest
magnitude / -8, as its reference quantizer writes it), so a Q4_0 tensor from a GGUF file keeps its
nibbles. The group scales are held as 7-bit codes relative to the row's largest (Int4Linear), so
that a nibble unpacks to an int8 weight by one table lookup and the multiply is int8 x int8 with
integer sums, as int8 kernels multiply: unmask's own kernel (int4.cpp; AVX512-VNNI, AVX2 or plain
C++ with OpenMP, built once per machine with its C++ compiler in a second or two, cached under
$UNMASK_CACHE_DIR or ~/.cache/unmask/kernels, called through ctypes). Activations are quantized
per row to int8 on the fly, so a row's output depends on nothing else in the batch. PyTorch's own int4 CPU matmul
(`_weight_int4pack_mm_for_cpu`) measured 20-55x slower than float32 on this project's machines, and
its dynamic 4-bit one (`_dyn_quant_matmul_4bit`) has a fast path only on ARM: hence a kernel of our
own.

A Q4_K tensor (llama.cpp's k-quant: unsigned nibbles q with a scale and a minimum per group of
32, w = s q - m) keeps its nibbles too: w = s (q - 8) + (8 s - m), the first term the kernel's,
the second an offset per group that multiplies the group's sum of the input: the offsets are
held as int8 codes with a scale per weight row, and the kernel adds sum_g code * (the group's
sum of the row's int8 activations) after its product, again in integer sums, so a row's output
still depends on nothing else in the batch (an int8 step of the offsets against the ~35 % larger
weight error of rounding a Q4_K tensor's weights to int4 again).

What stays in floating point: routers and norms. An untied output head and the token embedding
go to int8 (unmask.layers.quant: Int8Linear, Int8Embedding); a head tied to the embedding stays
float.
"""

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import torch
from torch import nn

from unmask.errors import UnmaskError

GROUP = 32
_lock = threading.Lock()
_kernels: dict = {}
# instruction sets the kernel is built for: "native" (this CPU's best: AVX512-VNNI, AVX2 or plain
# C++), or a lower one forced (env UNMASK_INT4_ISA; tests build each)
ISA_FLAGS = {"native": ["-march=native"], "avx2": ["-march=native", "-mno-avx512f"],
             "scalar": ["-mno-avx", "-mno-avx2"]}


class Kernel:
    """The compiled kernel (a shared library with a C ABI, called through ctypes)."""

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        lib.unmask_int4_linear.argtypes = [p, i64, i64, p, p, p, p, i64, i64, i64, p, p, p, i32]
        lib.unmask_int4_linear.restype = i32
        lib.unmask_int4_table.argtypes = [p]
        lib.unmask_int4_isa.restype = ctypes.c_char_p
        self.lib = lib

    def linear(self, x: torch.Tensor, packed: torch.Tensor, codes: torch.Tensor, r: torch.Tensor,
               corr: torch.Tensor, n: int, offsets: tuple | None = None) -> torch.Tensor:
        """x (M, K) float32 -> (M, n): the kernel's product with the packed weight (no bias), plus
        the groups' offsets times their input sums when given ((codes (Kp/64, Np, 2) int16, scales (Np,)))."""
        x = x.contiguous()
        m, k = x.shape
        y = torch.empty(m, n)
        oc, ro = (None, None) if offsets is None else (offsets[0].data_ptr(), offsets[1].data_ptr())
        bad = self.lib.unmask_int4_linear(x.data_ptr(), m, k, packed.data_ptr(), codes.data_ptr(), r.data_ptr(),
                                          corr.data_ptr(), packed.shape[0], 2 * packed.shape[1], n, y.data_ptr(),
                                          oc, ro, torch.get_num_threads())
        if bad:
            raise ValueError(f"int4 weight ({packed.shape[0]} x {2 * packed.shape[1]} packed) does not fit input "
                             f"{tuple(x.shape)}")
        return y

    def table(self) -> torch.Tensor:
        out = torch.empty(256, 16, dtype=torch.int8)
        self.lib.unmask_int4_table(out.data_ptr())
        return out

    def isa(self) -> str:
        return self.lib.unmask_int4_isa().decode()


def kernel(isa: str | None = None) -> Kernel:
    """The compiled kernel (built on first use with the C++ compiler, cached per machine; an
    UnmaskError naming what is missing if it cannot be built)."""
    isa = isa or os.environ.get("UNMASK_INT4_ISA") or "native"
    built = _kernels.get(isa)  # every layer's every forward asks: no lock once built
    if built is not None:
        return built
    if isa not in ISA_FLAGS:
        raise UnmaskError(f"UNMASK_INT4_ISA {isa!r} is not one of {', '.join(ISA_FLAGS)}", param="quantize")
    with _lock:
        if isa not in _kernels:
            _kernels[isa] = Kernel(_build(isa))
    return _kernels[isa]


def _build(isa: str) -> Path:
    """The shared library for `isa`, compiled once per source, flags and machine (the file name
    holds a hash of them and of this CPU's model), written under a temporary name then moved."""
    src = Path(__file__).with_name("int4.cpp")
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        raise UnmaskError("int4 weights need their CPU kernel, built here on first use, and no C++ compiler was "
                          "found (install g++ or set CXX)", param="quantize")
    # no fused multiply-add: a float expression rounds alike on every instruction set
    flags = ["-O3", "-std=c++17", "-fPIC", "-shared", "-fopenmp", "-ffp-contract=off", *ISA_FLAGS[isa]]
    key = hashlib.sha256(src.read_bytes() + " ".join([cxx, *flags, _cpu()]).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("UNMASK_CACHE_DIR") or Path.home() / ".cache" / "unmask") / "kernels"
    lib = cache / f"unmask_int4_{isa}_{key}.so"
    if lib.exists():
        return lib
    tmp = lib.with_name(f"{lib.name}.{os.getpid()}.tmp")
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UnmaskError(f"int4 weights need their CPU kernel, which could not be built in {cache} ({e}); set "
                          "UNMASK_CACHE_DIR to a writable folder", param="quantize") from None
    try:
        out = subprocess.run([cxx, *flags, str(src), "-o", str(tmp)], capture_output=True, text=True)
    except OSError as e:
        raise UnmaskError(f"int4 weights need their CPU kernel, and the C++ compiler {cxx} could not be run ({e}); "
                          "install g++ or set CXX", param="quantize") from None
    if out.returncode:
        tmp.unlink(missing_ok=True)
        raise UnmaskError(f"int4 weights need their CPU kernel, which did not build with {cxx}: "
                          f"{(out.stderr.strip().splitlines() or ['?'])[-1][:300]}", param="quantize")
    os.replace(tmp, lib)
    return lib


def _cpu() -> str:
    try:
        return next(line for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def quantize_groups(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A float weight (out, in) -> (nibbles (out, in) uint8 0..15 meaning q - 8, scales (out, in/32)
    float32), Q4_0's rounding: per group d = max / -8 of the element of largest magnitude,
    q = min(15, trunc(x / d + 8.5)). `in` must be a multiple of 32."""
    out, cols = w.shape
    if cols % GROUP:
        raise ValueError(f"int4 weights need inputs in groups of {GROUP}; this layer has {cols}")
    q = torch.empty(out, cols, dtype=torch.uint8)
    d = torch.empty(out, cols // GROUP)
    for i in range(0, out, 256):  # 256 rows at a time, each a copy rounded in place (lean)
        g = w[i : i + 256].to(torch.float32, copy=True).reshape(-1, cols // GROUP, GROUP)
        pick = g.abs().argmax(-1, keepdim=True)  # the first of largest magnitude, as ggml's loop picks
        di = g.gather(-1, pick).squeeze(-1) / -8
        inv = torch.where(di != 0, 1 / di, torch.zeros_like(di))
        q[i : i + 256] = g.mul_(inv[..., None]).add_(8.5).trunc_().clamp_(0, 15).reshape(-1, cols)  # (x*id + 8.5f)
        d[i : i + 256] = di
    return q, d


def from_q4_0_blocks(raw, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GGUF Q4_0 data (rows * cols/32 blocks of 18 bytes: fp16 d, 16 bytes of nibbles) -> (nibbles
    uint8 (rows, cols) 0..15, scales float32 (rows, cols/32))."""
    b = torch.from_numpy(np.array(raw, dtype=np.uint8)).reshape(rows, cols // GROUP, 18)
    d = b[..., :2].contiguous().view(torch.float16).squeeze(-1).float()
    packed = b[..., 2:]
    q = torch.cat([packed & 15, packed >> 4], -1)  # element j low nibble, j + 16 high
    return q.reshape(rows, cols), d


def from_q4_k_blocks(raw, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GGUF Q4_K data (rows * cols/256 blocks of 144 bytes: fp16 d, fp16 dmin, 12 bytes of 6-bit
    scales and minimums for 8 groups of 32, 128 bytes of nibbles) -> (nibbles uint8 (rows, cols)
    0..15, scales float32 (rows, cols/32), offsets float32 (rows, cols/32)) with w = scale * (q -
    8) + offset: llama.cpp's w = d sc q - dmin m, its group layout (a run of 32 bytes holds one
    group in its low nibbles and the next in its high ones)."""
    from gguf.quants import Q4_K

    b = np.array(raw, dtype=np.uint8).reshape(-1, 144)
    d = b[:, 0:2].view(np.float16).astype(np.float32)
    dmin = b[:, 2:4].view(np.float16).astype(np.float32)
    sc, m = Q4_K.get_scale_min(b[:, 4:16])
    scale = torch.from_numpy(d * sc.astype(np.float32))  # (blocks, 8)
    low = torch.from_numpy(dmin * m.astype(np.float32))
    qs = torch.from_numpy(b[:, 16:]).reshape(-1, 4, 1, 32)
    q = torch.cat([qs & 15, qs >> 4], 2).reshape(rows, cols)  # group 2c: low nibbles of run c, 2c+1 high
    return q, scale.reshape(rows, cols // GROUP), (8 * scale - low).reshape(rows, cols // GROUP)


def table() -> torch.Tensor:
    """The int8 weight of each (scale code + 128, nibble): round((q - 8) * c / 8), as the kernel's."""
    c = torch.arange(256, dtype=torch.float64)[:, None] - 128
    q = torch.arange(16, dtype=torch.float64)[None] - 8
    return torch.round(q * c / 8).clamp(-127, 127).to(torch.int8)


class Int4Linear(nn.Module):
    """nn.Linear's forward over 4-bit weights in groups of 32 (llama.cpp's Q4_0 nibbles).

    Each group's float scale is kept as a signed 7-bit code relative to the row's largest (c =
    round(127 d / max |d|)), so a nibble q is the int8 weight round((q - 8) c / 8) times the row's
    scale r = max |d| * 8 / 127: the 4-bit value put on the row's int8 grid, which the kernel
    multiplies as int8 x int8 with int32 sums (unmask/layers/int4.cpp). The re-expression moves a
    weight by at most one int8 step r (half for the code, half for the grid), 8/127 of a 4-bit step
    of the row's largest group (`dequantized()` gives the weight multiplied). `offsets` (out,
    in/32): a float added to each group's weights (Q4_K's minimums: see the module docstring)."""

    def __init__(self, nibbles: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None,
                 like: nn.Module | None = None, offsets: torch.Tensor | None = None) -> None:
        super().__init__()
        out, cols = nibbles.shape
        if cols % GROUP:
            raise ValueError(f"int4 weights need inputs in groups of {GROUP}; this layer has {cols}")
        if offsets is not None and tuple(offsets.shape) != (out, cols // GROUP):
            raise ValueError(f"int4 offsets of shape {tuple(offsets.shape)}, expected {(out, cols // GROUP)}")
        self.in_features, self.out_features = cols, out
        kp, np_ = -(-cols // 64) * 64, -(-out // 8) * 8
        q = torch.full((np_, kp), 8, dtype=torch.uint8)
        q[:out, :cols] = nibbles
        d = torch.zeros(np_, kp // GROUP, dtype=torch.float64)
        d[:out, : cols // GROUP] = scales.double()
        top = d.abs().amax(1)
        codes = torch.round(127 * d / torch.where(top > 0, top, 1)[:, None]).clamp(-127, 127).to(torch.int64) + 128
        g = q.view(np_, kp // GROUP, GROUP)
        lut, corr = table(), torch.empty(np_, dtype=torch.int32)
        for i in range(0, np_, 256):  # 128 * the row's int8 weights' sum, in chunks of rows (lean)
            w8 = lut[codes[i : i + 256, :, None], g[i : i + 256].long()]  # (rows, groups, 32) int8
            corr[i : i + 256] = 128 * w8.sum((1, 2), dtype=torch.int64)
        del w8
        self.register_buffer("packed", (g[..., :16] | (g[..., 16:] << 4)).reshape(np_, kp // 2).contiguous(),
                             persistent=False)
        self.register_buffer("codes", codes.to(torch.uint8), persistent=False)
        self.register_buffer("r", (top * 8 / 127).float(), persistent=False)
        self.register_buffer("corr", corr, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.detach().float(), persistent=False)
        # the groups' offsets (Q4_K's minimums): int8 codes per group and a scale per weight row
        oc = ro = None
        if offsets is not None:
            o = torch.zeros(np_, kp // GROUP, dtype=torch.float64)
            o[:out, : cols // GROUP] = offsets.double()
            top = o.abs().amax(1)
            ro = torch.where(top > 0, top / 127, torch.ones_like(top))
            oc = torch.round(o / ro[:, None]).clamp(-127, 127).to(torch.int16)
            oc = oc.view(np_, -1, 2).transpose(0, 1).contiguous()  # (pairs of groups, rows, 2): the kernel's
            ro = ro.float()
        self.register_buffer("offset_codes", oc, persistent=False)
        self.register_buffer("offset_scale", ro, persistent=False)
        self.weight_bytes = self.packed.numel() + self.codes.numel() + 4 * np_ + \
            (0 if oc is None else 2 * oc.numel() + 4 * np_)
        if like is not None:
            self._forward_hooks.update(like._forward_hooks)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None, like: nn.Module | None = None):
        if weight.device.type != "cpu":
            raise ValueError("int4 linear layers run on CPU only")
        q, d = quantize_groups(weight.detach())
        return cls(q, d, bias, like)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Int4Linear":
        return cls.from_weight(linear.weight, linear.bias, linear)

    def int8_weight(self) -> torch.Tensor:
        """The int8 weight the kernel multiplies (padded shape)."""
        g = self.packed.view(self.packed.shape[0], -1, 16)
        q = torch.cat([g & 15, g >> 4], -1).long()
        return table()[self.codes.long()[..., None], q].reshape(self.packed.shape[0], -1)

    def dequantized(self) -> torch.Tensor:
        """The float weight this layer multiplies by (out, in)."""
        w = (self.int8_weight().float() * self.r[:, None])[: self.out_features, : self.in_features]
        if self.offset_codes is not None:
            codes = self.offset_codes.transpose(0, 1).reshape(len(self.offset_scale), -1)  # (rows, groups)
            o = (codes.float() * self.offset_scale[:, None])[: self.out_features, : self.in_features // GROUP]
            w = (w.view(self.out_features, -1, GROUP) + o[..., None]).reshape(w.shape)
        return w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).float()
        offsets = None if self.offset_codes is None else (self.offset_codes, self.offset_scale)
        y = kernel().linear(flat, self.packed, self.codes, self.r, self.corr, self.out_features, offsets)
        if self.bias is not None:
            y += self.bias
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 groups of {GROUP}"


def available() -> bool:
    """Whether the kernel builds here (a compiler present); builds it."""
    try:
        kernel()
    except UnmaskError:
        return False
    return True



def dequantize(nibbles: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(nibbles (out, in) 0..15, scales (out, in/32)) -> the float weight (out, in)."""
    out, cols = nibbles.shape
    q = nibbles.float().view(out, cols // GROUP, GROUP) - 8
    return (q * scales.float()[..., None]).reshape(out, cols)
