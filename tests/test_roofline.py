"""The roofline cost model reproduces seed 000's worked numbers."""

import json

import pytest

from unmask.bench.hardware import PRESETS, Hardware
from unmask.bench.roofline import ModelCost, Roofline


@pytest.fixture
def seed():
    return Roofline(PRESETS["h100-sxm"], ModelCost.seed_7b())


def test_single_request_latencies(seed):
    ms = lambda s: round(s * 1e3)  # noqa: E731
    assert seed.step(1) * 1e3 == pytest.approx(4.18, abs=0.005)
    assert ms(seed.step(512)) == 7
    assert ms(seed.ar_latency(512, 256)) == 1076
    assert ms(seed.diffusion_latency(512, 256, 1)) == 2782
    assert ms(seed.diffusion_latency(512, 256, 4)) == 696
    assert ms(seed.block_latency(512, 256, 4, 32)) == 275
    assert ms(seed.block_latency(512, 256, 4, 32, seal_forwards=True)) == 308


def test_concurrency_caps_and_crossover(seed):
    assert round(seed.diffusion_throughput(64, 4, 32)) == 8834
    assert round(1 / (seed.model.flops_per_position / seed.hw.peak_flops)) == 70671
    assert round(seed.diffusion_throughput(9, 4, 32)) < 8834 < round(seed.diffusion_throughput(10, 4, 32)) + 1
    assert seed.crossover(4, 32) == 37
    # low batch: the diffusion advantage is about tau; compute-bound: about tau / G
    assert seed.diffusion_throughput(1, 4, 32) / seed.ar_throughput(1) == pytest.approx(4, rel=1e-6)
    assert seed.diffusion_throughput(400, 4, 32) / seed.ar_throughput(400) == pytest.approx(4 / 32, rel=1e-6)


def test_attention_terms_only_add_cost(seed):
    from unmask.models.base import ArchConfig

    arch = ArchConfig("llada", 126464, 4096, 32, 32, 32, 12288, 5e5, 1e-5, 4096)
    plain = Roofline(PRESETS["h100-sxm"], ModelCost.from_arch(arch))
    full = Roofline(PRESETS["h100-sxm"], ModelCost.from_arch(arch, attention=True))
    assert plain.model.weight_bytes == pytest.approx(2 * 8.0e9, rel=0.03)  # LLaDA-8B in bf16
    for n in (1, 32, 768):
        assert full.step(n, 768) >= plain.step(n)


def test_cli_prints_seed_example_and_writes_plot(capsys, tmp_path, llada_dir):
    import json

    from unmask.cli import main

    assert main(["roofline"]) == 0
    out = capsys.readouterr().out
    assert "1076 ms" in out and "2782 ms" in out and "308 ms" in out and "batch 37" in out
    png = tmp_path / "r.png"
    assert main(["roofline", "--model", str(llada_dir), "--attention", "--json", "--plot", str(png)]) == 0
    pred = json.loads(capsys.readouterr().out)
    assert png.stat().st_size > 1000 and pred["latency_ms"]["ar"] > 0
    assert main(["roofline", "--hardware", "tpu"]) == 2
    assert "unknown hardware 'tpu'" in capsys.readouterr().err


def test_moe_roofline_reads_the_experts_its_positions_choose(capsys):
    from unmask.bench import roofline as rl
    from unmask.bench import shapes
    from unmask.cli import main

    mini, flash = shapes.moe_shape("llada2-mini"), shapes.moe_shape("llada2-flash")
    assert 15.5e9 < mini.num_parameters() < 17e9 and 1.2e9 < mini.num_parameters(active=True) < 1.6e9  # 16B-A1.4B
    assert 95e9 < flash.num_parameters() < 110e9 and 5e9 < flash.num_parameters(active=True) < 7.5e9  # 100B-A6.1B
    r = rl.build("h200", mini)
    m = r.model
    assert m.distinct_experts(1) == pytest.approx(8) and m.distinct_experts(10_000) == pytest.approx(256)
    reads = [m.read_bytes(n) for n in (1, 8, 32, 256, 4096)]
    assert reads == sorted(reads) and reads[-1] == pytest.approx(m.weight_bytes)
    assert m.flops_per_position < 0.2 * 2 * mini.num_parameters()  # compute follows the active parameters
    # one block-diffusion step over 32 positions reads far more experts than one AR token
    assert r.step(32) > 5 * r.step(1)
    assert main(["roofline", "--model", "llada2-flash", "--hardware", "h100-sxm", "--json"]) == 0
    pred = json.loads(capsys.readouterr().out)
    steps = {(s["batch"], s["positions_per_request"]): s for s in pred["moe"]["steps"]}
    assert steps[(1, 32)]["experts_read_per_layer"] > 20 * steps[(1, 1)]["experts_read_per_layer"] / 2


def test_renoising_roofline_counts_the_canvas(capsys):
    """DiffusionGemma 26B-A4B: 25 B parameters, about 3.8 B active; a denoising step over a
    256-position canvas reads nearly every expert, so fewer denoising steps per canvas mean more
    tokens/s, and AR is matched at a stated step count."""
    from unmask.bench.shapes import renoise_shape
    from unmask.bench.roofline_tables import renoise_table
    from unmask.cli import main

    arch = renoise_shape("diffusiongemma-26b-a4b")
    assert 24.5e9 < arch.num_parameters() < 26e9 and 3.5e9 < arch.num_parameters(active=True) < 4.2e9
    r = Roofline(PRESETS["h200"], ModelCost.from_arch(arch, 2.0))
    t = renoise_table(r, arch, 512, steps=(8, 48), batches=(1,))
    fast, slow = t["rows"]
    assert fast["tokens_per_s"] > slow["tokens_per_s"] and fast["experts_read_per_layer"] > 120
    assert 8 < t["break_even_steps"][1] < 48
    assert main(["roofline", "--model", "diffusiongemma-26b-a4b", "--hardware", "h200", "--batches", "1,8",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["canvas"] == 256 and {row["batch"] for row in out["rows"]} == {1, 8}


def test_tensor_parallel_roofline(capsys):
    """N ranks read and compute 1/N each and pay 2 all-reduces per layer (3 for DiffusionGemma's
    dense MLP beside its experts); one rank pays none; a model too big for one GPU is marked."""
    from unmask.bench import roofline as rl
    from unmask.bench import shapes
    from unmask.bench import roofline_tables as rt
    from unmask.cli import main

    arch = shapes.dense_shape("llada-8b")
    r = rl.build("h200", arch)
    t = rt.tp_table(r, arch, rt.LINKS["h200"], (1, 2, 8), gpu_memory=rt.GPU_MEMORY["h200"])
    one = [row for row in t["rows"] if row["ranks"] == 1]
    assert all(row["comm_ms"] == 0 and row["speedup"] == 1 and row["fits"] for row in one)
    canvas = [row for row in t["rows"] if row["forward"] == "canvas (256)" and row["batch"] == 64]
    assert [row["ranks"] for row in canvas] == [1, 2, 8]
    assert canvas[1]["compute_ms"] == pytest.approx(canvas[0]["compute_ms"] / 2)
    assert 1 < canvas[1]["speedup"] < 2 and canvas[2]["all_reduces"] == 2 * 32 + 1
    gemma = shapes.renoise_shape("diffusiongemma-26b-a4b")
    g = rt.tp_table(rl.build("h200", gemma), gemma, rt.LINKS["h200"], (2,))
    assert g["rows"][0]["all_reduces"] == 3 * 30 + 1
    flash = shapes.moe_shape("llada2-flash")
    f = rt.tp_table(rl.build("h200", flash), flash, rt.LINKS["h200"], (1, 2), gpu_memory=rt.GPU_MEMORY["h200"])
    assert [row["fits"] for row in f["rows"][:2]] == [False, True]
    assert main(["roofline", "--model", "llada-8b", "--hardware", "h200", "--tensor-parallel", "1,4"]) == 0
    assert "speedup" in capsys.readouterr().out
    assert main(["roofline", "--tensor-parallel", "2"]) == 2
    assert "needs --model" in capsys.readouterr().err


def test_int8_weights_and_the_cpu_step_table(capsys, monkeypatch):
    """int8 prices 1 byte for the quantized weights and 4 for what stays float32 (embedding, head,
    grouped experts); the CPU's rates are measured with the engine's own layers; the step table
    puts this CPU beside the GPU presets; bad combinations are named."""
    from unmask.bench import roofline as rl
    from unmask.bench import shapes
    from unmask.bench import roofline_tables as rt
    from unmask.cli import main
    from unmask.errors import UnmaskError

    arch = shapes.dense_shape("llada-8b")
    kept = 2 * arch.vocab_size * arch.hidden_size
    f32 = ModelCost.from_arch(arch, 4.0)
    i8 = ModelCost.from_arch(arch, 1.0, float_bytes=4.0)
    assert i8.weight_bytes == pytest.approx((f32.weight_bytes / 4 - kept) + 4 * kept)
    assert i8.flops_per_position == f32.flops_per_position
    flash = shapes.moe_shape("llada2-flash")
    assert ModelCost.from_arch(flash, 1.0, float_bytes=4.0).expert_bytes == ModelCost.from_arch(flash, 4.0).expert_bytes
    fake = Hardware("this CPU (fake)", 20e9, 1e11)
    monkeypatch.setattr(rl, "measure_cpu", lambda seconds=0.5, weights="float32": fake)
    r = rl.build("cpu", arch, weights="int8")
    assert r.model.weight_bytes == pytest.approx(i8.weight_bytes)
    t = rt.step_table({"cpu int8": r, "h200 bf16": rl.build("h200", arch)}, arch, 0)
    assert set(t["cpu int8"]["ms"]) == {f"b{b} G{g}" for b in (1, 8) for g in (1, 8, 32)}
    assert t["cpu int8"]["ms"]["b1 G1"] == pytest.approx(1e3 * i8.weight_bytes / 20e9, rel=1e-3)
    with pytest.raises(UnmaskError, match="weights int8: the measured weight types are this CPU's"):
        rl.build("h200", arch, weights="int8")
    assert main(["roofline", "--model", "llada-8b", "--step-table", "--batches", "1"]) == 0
    out = capsys.readouterr().out
    assert "cpu int8" in out and "h200 bf16" in out and "b1 G32" in out
    assert main(["roofline", "--step-table"]) == 2
    assert "needs --model" in capsys.readouterr().err


def test_measured_cpu_rates_use_the_engines_layers():
    from unmask.bench.hardware import measure_cpu

    hw = measure_cpu(0.05, "int8")
    assert "int8 (FBGEMM)" in hw.name and hw.bandwidth > 0 and hw.peak_flops > 0
    assert "float32" in measure_cpu(0.05).name
