"""float32 linear layers through the faster kernel per shape (unmask.layers.dispatch, issue 25):
oneDNN's output equals nn.Linear's, the crossover rule, the per-machine record, the loader's and
LLM's choice (checkpoint names kept, greedy output unchanged), errors by name."""

import json

import pytest
import torch
from torch import nn

from checkpoints import write_llada
from unmask import LLM
from unmask.errors import UnmaskError
from unmask.layers import dispatch
from unmask.layers.dispatch import NEVER, OneDNNLinear, crossover, use_kernels
from unmask.models.loader import load_model

pytestmark = pytest.mark.skipif(not dispatch.onednn_available(), reason="PyTorch built without oneDNN")


@pytest.fixture(autouse=True)
def _own_record(tmp_path, monkeypatch):
    monkeypatch.setenv("UNMASK_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("from_rows", [1, 4])
@pytest.mark.parametrize("bias", [False, True])
def test_onednn_linear_equals_nn_linear(from_rows, bias):
    torch.manual_seed(0)
    lin = nn.Linear(48, 80, bias=bias)
    fast = OneDNNLinear.from_linear(lin, from_rows)
    for shape in [(1, 48), (3, 48), (2, 5, 48), (4, 7, 48), (2, 0, 48)]:  # (no rows: logits at no position)
        x = torch.randn(shape)
        torch.testing.assert_close(fast(x), lin(x), rtol=1e-5, atol=1e-5)
    x = torch.randn(6, 48, 3).transpose(1, 2)  # not contiguous
    torch.testing.assert_close(fast(x), lin(x), rtol=1e-5, atol=1e-5)
    state = fast.state_dict()  # the checkpoint's names and layout, read back from the reordered weight
    assert set(state) == set(lin.state_dict()) and torch.equal(state["weight"], lin.weight)
    assert (fast.weight is None) == (from_rows == 1)  # the plain copy is kept only for the few-row path


def test_a_large_weight_is_reordered_in_blocks(monkeypatch):
    """Above BLOCK_BYTES the weight is reordered (and multiplied) in blocks of output rows, so a
    load never holds a second whole copy of an 8B model's head: same outputs, same state dict."""
    monkeypatch.setattr(dispatch, "BLOCK_BYTES", 4 * 48 * 16)  # 16 rows of 48 inputs per block
    torch.manual_seed(0)
    lin = nn.Linear(48, 70)
    fast = OneDNNLinear.from_linear(lin)
    assert len(fast._blocks) == 5 and fast.packed_bytes == 4 * 48 * 70
    x = torch.randn(2, 3, 48)
    torch.testing.assert_close(fast(x), lin(x), rtol=1e-5, atol=1e-5)
    assert torch.equal(fast.state_dict()["weight"], lin.weight)


def test_crossover_rule():
    rows = (1, 2, 4, 8)
    assert crossover(rows, [1, 1, 1, 1], [2, 2, 2, 2]) == NEVER
    assert crossover(rows, [1, 1, 1, 1], [0.5, 0.5, 0.5, 0.5]) == 1
    assert crossover(rows, [1, 1, 2, 2], [2, 2, 1, 1]) == 4
    assert crossover(rows, [1, 3, 1, 3], [2, 2, 2, 2]) == 8  # a win below a loss does not count
    assert crossover(rows, [1, 1, 1, 1], [1, 1, 1, 1]) == NEVER  # a tie stays on the default


def test_choice_is_measured_once_and_recorded(monkeypatch):
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32), nn.Linear(32, 64))
    calls = []
    real = dispatch.measure
    monkeypatch.setattr(dispatch, "measure", lambda w: calls.append(tuple(w.shape)) or real(w, rows=(1, 2)))
    plan = dispatch.choices(model)
    assert sorted(calls) == [(32, 64), (64, 32)]  # one measurement per distinct shape
    record = json.loads(dispatch.cache_path().read_text())[dispatch.machine_key()]
    assert set(record) == {"32x64", "64x32"} and set(record["32x64"]) >= {"rows", "default_ms", "onednn_ms"}
    assert plan == {(32, 64): record["32x64"]["from_rows"], (64, 32): record["64x32"]["from_rows"]}
    monkeypatch.setattr(dispatch, "measure", lambda w: pytest.fail("measured again"))
    assert dispatch.choices(model) == plan
    n = use_kernels(model, "auto")
    assert n == sum(isinstance(m, OneDNNLinear) for m in model) == sum(v < NEVER for v in
                                                                       [plan[(32, 64)], plan[(64, 32)], plan[(32, 64)]])


def test_a_large_weight_is_never_held_twice(monkeypatch):
    """A layer oneDNN takes only from some row count keeps its plain weight for fewer rows; above
    KEEP_PLAIN_BYTES it goes to oneDNN at every row count instead (no second copy)."""
    monkeypatch.setattr(dispatch, "measure", lambda w: {"from_rows": 4})
    small, large = nn.Linear(32, 64), nn.Linear(64, 128)
    monkeypatch.setattr(dispatch, "KEEP_PLAIN_BYTES", 4 * 64 * 64)
    assert dispatch.plan_for(small.weight) == 4 and dispatch.plan_for(large.weight) == 1
    model = nn.Sequential(small, nn.ReLU(), large)
    x = torch.randn(2, 32)
    want = model(x)
    use_kernels(model, "auto")
    assert model[0].weight is not None and model[2].weight is None  # only the small one keeps its copy
    torch.testing.assert_close(model(x), want, rtol=1e-5, atol=1e-5)


def test_an_unwritable_record_is_not_an_error(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("UNMASK_CACHE_DIR", str(tmp_path / "file" / "inside"))
    monkeypatch.setattr(dispatch, "measure", lambda w: {"rows": [1], "default_ms": [1], "onednn_ms": [0.5],
                                                         "from_rows": 1})
    assert use_kernels(nn.Sequential(nn.Linear(8, 8)), "auto") == 1


def test_loaded_model_on_onednn_keeps_names_and_logits(tmp_path):
    path = write_llada(tmp_path / "m", d=64, ff=128)
    plain, _ = load_model(path, linear_kernel="default")
    fast, _ = load_model(path, linear_kernel="onednn")
    assert any(isinstance(m, OneDNNLinear) for m in fast.modules())
    assert not any(isinstance(m, OneDNNLinear) for m in plain.modules())
    a, b = plain.state_dict(), fast.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    ids = torch.tensor([[5, 9, 13, 2, 7, 11, 3, 8], [1, 2, 3, 4, 5, 6, 7, 8]])
    pos = torch.arange(8)[None].expand(2, -1)
    with torch.no_grad():
        torch.testing.assert_close(fast(ids, pos), plain(ids, pos), rtol=1e-4, atol=1e-4)


def test_embedded_models_decode_alike_on_every_kernel():
    """Greedy output of the embedded diffusion model and its AR twin: the same tokens on the
    default kernel and on oneDNN (floating-point rounding apart: counted, at most one prompt)."""
    from unmask.tasks import TASKS, split_examples

    prompts = [ex.prompt for t in TASKS for ex in split_examples(t, "selection", 1)]
    for name in ("default", "default-ar"):
        a, b = LLM(name, linear_kernel="default"), LLM(name, linear_kernel="onednn")
        assert any(isinstance(m, OneDNNLinear) for m in b.model.modules())
        p = a.default_params()
        x, y = a.generate(prompts, p, chat=False), b.generate(prompts, p, chat=False)
        assert sum(r.raw_ids != s.raw_ids for r, s in zip(x.results, y.results)) <= 1


def test_kernel_errors_name_the_value(tmp_path, monkeypatch):
    path = write_llada(tmp_path / "m")
    with pytest.raises(UnmaskError, match="linear_kernel 'mkl'"):
        LLM(path, linear_kernel="mkl")
    monkeypatch.setenv("UNMASK_LINEAR_KERNEL", "fast")
    with pytest.raises(UnmaskError, match="UNMASK_LINEAR_KERNEL 'fast'"):
        load_model(path)
    with pytest.raises(ValueError, match="unknown linear kernel"):
        use_kernels(nn.Linear(2, 2), "mkl")


def test_reference_modes_compute_on_the_default_kernel(tmp_path):
    """A compat mode promises its reference's tokens on any machine, whatever `--linear-kernel`
    resolves to there: the two kernels round differently (measured: Fast-dLLM's sampler on a
    random 25 M LLaDA, prompt 512, differed from its reference at 2-47 of 128 positions on oneDNN),
    so the reference loops run inside `default_numerics`, where oneDNN layers compute with
    PyTorch's kernel on their plain weight: bit for bit the default kernel's logits."""
    from unmask.layers.dispatch import default_numerics

    path = write_llada(tmp_path / "m", d=256, ff=688, heads=4, kv_heads=4)
    plain, fast = LLM(path, linear_kernel="default"), LLM(path, linear_kernel="onednn")
    layers = [m for m in fast.model.modules() if isinstance(m, OneDNNLinear)]
    assert layers and all(m.weight is None for m in layers)  # onednn keeps no plain copy
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 20, (2, 40), generator=g)
    pos = torch.arange(40)[None].expand(2, -1)
    with torch.no_grad():
        a, b = plain.model(ids, pos), fast.model(ids, pos)
        with default_numerics(fast.model):
            c = fast.model(ids, pos)
    assert not torch.equal(a, b)  # what a reference mode must not see
    assert torch.equal(a, c)
    assert all(m._plain is None for m in layers)  # the read-back copies are freed on leaving

    seen = []
    layers[0].register_forward_hook(lambda m, i, o: seen.append(m._plain is not None))
    prompts = [[5, 9, 13, 2], [1, 2, 3, 4]]
    ref = fast.generate(prompts, dict(compat="llada", gen_length=8, block_length=8, steps=8))
    assert seen and all(seen)
    assert [r.raw_ids for r in ref.results] == [r.raw_ids for r in plain.generate(
        prompts, dict(compat="llada", gen_length=8, block_length=8, steps=8)).results]
    seen.clear()
    fast.generate(prompts, dict(gen_length=8, block_length=8))  # native decoding keeps the faster kernel
    assert seen and not any(seen)
