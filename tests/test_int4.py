"""int4 weights (unmask.layers.int4): llama.cpp's Q4_0 rounding exactly, the kernel equal to its
reference (activations quantized per row, the dequantized weight) for every shape and row count,
in every instruction set it is built for, and the front ends' int4."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from unmask.errors import UnmaskError
from unmask.layers import int4
from unmask.layers.int4 import Int4Linear, from_q4_0_blocks, quantize_groups


def reference(layer: Int4Linear, x: torch.Tensor) -> torch.Tensor:
    """What the kernel computes, in float64: x quantized per row to int8 as the kernel rounds it
    (float32: scale max |x| / 127, x times its reciprocal, to the nearest even), times the
    dequantized weight."""
    x = x.float()
    amax = x.abs().amax(1, keepdim=True)
    s = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    xq = torch.round(x * (1 / s)).clamp(-127, 127).double()
    y = s.double() * (xq @ layer.dequantized().double().T)
    return y if layer.bias is None else y + layer.bias.double()


def test_the_rounding_is_llama_cpps_q4_0():
    """quantize_groups writes what gguf-py's Q4_0 quantizer (llama.cpp's reference, in numpy)
    writes: the same nibbles, the same scales (GGUF stores them as float16)."""
    import gguf

    w = torch.randn(12, 160, generator=torch.Generator().manual_seed(0)) * 0.05
    w[3, :32] = 0  # an all-zero group: scale 0, every nibble 8
    raw = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q4_0)
    q_ref, d_ref = from_q4_0_blocks(raw, *w.shape)
    q, d = quantize_groups(w)
    assert torch.equal(q, q_ref) and torch.equal(d.half().float(), d_ref)
    back = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_0)
    assert np.array_equal(int4.dequantize(q_ref, d_ref).numpy(), back)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 9), k_groups=st.integers(1, 6), n=st.integers(1, 40), bias=st.booleans(),
       offsets=st.booleans(), seed=st.integers(0, 2**16))
def test_the_kernel_is_its_reference_at_every_shape(m, k_groups, n, bias, offsets, seed):
    """Row counts off the 4-row tile, inputs off the 64 the kernel pads to, outputs off its 8 and its
    16-row blocks; with and without per-group offsets (a Q4_K tensor's minimums)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, 32 * k_groups, generator=g)
    off = torch.randn(n, k_groups, generator=g) if offsets else None
    layer = Int4Linear(*quantize_groups(w), torch.randn(n, generator=g) if bias else None, offsets=off)
    x = torch.randn(m, 32 * k_groups, generator=g) * 3
    x[0] = 0 if m > 2 else x[0]  # a row of zeros
    y = layer(x)
    assert y.shape == (m, n) and y.dtype == torch.float32
    torch.testing.assert_close(y.double(), reference(layer, x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("offsets", [False, True])
def test_a_row_does_not_depend_on_the_others(offsets):
    """Activations are quantized per row and sums are integers: each row's output alone equals it
    in any batch (the engine's invariant), whatever the row count's tiling, offsets or not."""
    w = torch.randn(24, 4160)  # inputs over two of the kernel's chunks
    layer = Int4Linear(*quantize_groups(w), offsets=torch.randn(24, 130) if offsets else None)
    x = torch.randn(19, 4160)
    whole = layer(x)
    assert all(torch.equal(layer(x[i : i + 1]), whole[i : i + 1]) for i in range(19))
    assert torch.equal(layer(x[3:12]), whole[3:12])


def test_the_table_and_scale_codes_hold_the_weight_closely():
    """The 7-bit scale codes and the int8 grid move each weight by at most one int8 step of its row
    (r: half for the code, half for the grid), and add little to the 4-bit rounding error
    (measured +0.5 % in norm on Gaussian weights)."""
    w = torch.randn(64, 512, generator=torch.Generator().manual_seed(3))
    q, d = quantize_groups(w)
    exact = int4.dequantize(q, d)
    layer = Int4Linear(q, d)
    assert torch.equal(int4.kernel().table(), int4.table())
    assert ((layer.dequantized() - exact).abs() <= layer.r[:64, None] * (1 + 1e-5)).all()
    grown = (layer.dequantized() - w).norm() / (exact - w).norm()
    assert grown < 1.03, grown


def test_the_kernel_keeps_leading_dimensions_and_dtype():
    layer = Int4Linear.from_weight(torch.randn(40, 64))
    x = torch.randn(2, 3, 64)
    y = layer(x)
    assert y.shape == (2, 3, 40)
    torch.testing.assert_close(y.reshape(6, 40).double(), reference(layer, x.reshape(6, 64)), rtol=1e-4, atol=1e-4)


def test_a_layer_it_cannot_hold_is_refused_by_name():
    with pytest.raises(ValueError, match="groups of 32.*48"):
        Int4Linear.from_weight(torch.randn(8, 48))
    with pytest.raises(UnmaskError, match="UNMASK_INT4_ISA 'sse9'"):
        int4.kernel("sse9")


def test_a_kernel_that_cannot_be_built_is_refused_by_name(tmp_path, monkeypatch):
    """No compiler, or a cache folder that cannot be written: an UnmaskError naming it, nothing
    half-written left."""
    monkeypatch.setattr(int4, "_kernels", {})
    monkeypatch.setenv("UNMASK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(UnmaskError, match="compiler .*no-such-compiler could not be run"):
        int4.kernel()
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("UNMASK_CACHE_DIR", str(tmp_path / "file"))  # a file where a folder must go
    with pytest.raises(UnmaskError, match="could not be built in .*file.*UNMASK_CACHE_DIR"):
        int4.kernel()
    monkeypatch.setenv("UNMASK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", "false")  # a compiler that fails
    with pytest.raises(UnmaskError, match="did not build with false"):
        int4.kernel()
    assert not list((tmp_path / "cache" / "kernels").glob("*"))


@pytest.mark.slow
@pytest.mark.parametrize("isa", ["avx2", "scalar"])
def test_every_instruction_set_computes_the_same(isa):
    """The AVX2 and plain C++ paths (built here by forcing them) form the same integer sums as the
    native one, so their outputs are equal to the bit."""
    k, native = int4.kernel(isa), int4.kernel()
    assert k.isa() == isa and torch.equal(k.table(), int4.table())
    g = torch.Generator().manual_seed(1)
    for m, n, cols in [(1, 5, 96), (7, 12, 256), (33, 9, 64), (9, 3, 4160), (6, 57, 320)]:
        for offsets in (None, torch.randn(n, cols // 32, generator=g)):
            layer = Int4Linear(*quantize_groups(torch.randn(n, cols, generator=g)), offsets=offsets)
            x = torch.randn(m, cols, generator=g)
            args = (layer.packed, layer.codes, layer.r, layer.corr, n,
                    None if offsets is None else (layer.offset_codes, layer.offset_scale))
            y = k.linear(x, *args)
            assert torch.equal(y, native.linear(x, *args))
            torch.testing.assert_close(y.double(), reference(layer, x), rtol=1e-4, atol=1e-4)


def test_the_front_ends_take_int4():
    """`unmask generate --quantize int4` (its own process: the kernel found in the cache or built),
    and the server's loading path through LLM.check_args."""
    import subprocess
    import sys

    from unmask import LLM

    assert LLM.check_args("default", quantize="int4") is not None
    out = subprocess.run([sys.executable, "-m", "unmask", "generate", "--quantize", "int4", "--model", "default",
                          "copy : red 4 owl"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "red 4 owl", out.stderr[-500:]
