"""Step time of a renoising model (DiffusionGemma layout) in the request engine, on this CPU,
beside the roofline's prediction for the same forwards.

Two random-weight shapes: the tiny test config (hidden 64, 3 layers, 4 experts) and a 25 M-class
shape with MoE layers (hidden 512, 8 layers in Gemma 4's sliding/full pattern, 8 experts of 128,
top 2, beside a dense MLP of 688). For each canvas length (the release's 256, and 32) and batch
(1, 8): b requests with a prompt of --prompt tokens run through the engine's renoising rows for --steps
denoising steps per canvas; the encoder pass (the prompt), each denoising step (forward plus the
sampler: temperature, draw, entropy bound, renoising, stopping test) and the engine's own time
are timed apart. Random weights never stop a canvas early, so the forwards per canvas are the
step limit (--steps); adaptive stopping needs a trained model. The prediction is the roofline
with this machine's measured bandwidth and float32 matmul rate (unmask.bench.hardware.measure_cpu):
a lower bound, which ignores each call's fixed cost. Writes JSON (default
benchmarks/results/renoise_step_cpu.json) and prints a table.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/renoise_step.py
"""

import argparse
import os
import statistics
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from unmask.bench import roofline as rl  # noqa: E402
from unmask.bench import roofline_tables as rt  # noqa: E402
from unmask.bench.hardware import measure_cpu  # noqa: E402
from unmask.bench.runner import context  # noqa: E402
from unmask.engine import Engine, EngineConfig  # noqa: E402
from unmask.files import writable_folder, write_json_atomic  # noqa: E402
from unmask.models.base import TokenIds  # noqa: E402
from unmask.models.diffusion_gemma import DiffusionGemmaModel  # noqa: E402
from unmask.models.diffusion_gemma_config import diffusion_gemma_arch  # noqa: E402
from unmask.params import GenerationParams  # noqa: E402

SHAPES = {
    "tiny": dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1, num_experts=4,
                 top_k_experts=2, moe_intermediate_size=32, sliding_window=8,
                 layer_types=["sliding_attention", "full_attention", "full_attention"]),
    "25m-moe": dict(vocab_size=512, hidden_size=512, intermediate_size=688, num_hidden_layers=8, num_attention_heads=8,
                    num_key_value_heads=4, head_dim=64, global_head_dim=128, num_global_key_value_heads=2,
                    num_experts=8, top_k_experts=2, moe_intermediate_size=128, sliding_window=512),
}


def build(shape: str, canvas: int, seed: int = 0) -> DiffusionGemmaModel:
    arch = diffusion_gemma_arch({"canvas_length": canvas, "text_config": {**SHAPES[shape],
                                                                           "max_position_embeddings": 65536}})
    torch.manual_seed(seed)
    model = DiffusionGemmaModel(arch)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02) if p.dim() >= 2 else p.fill_(1.0)
    return model.eval()


def run(model, batch: int, prompt: int, steps: int) -> dict:
    V = model.config.vocab_size
    tokens = TokenIds(mask=None, eos=V - 1, pad=V - 2, stop=(V - 1,))
    engine = Engine(model, tokens, EngineConfig(max_num_seqs=batch, trace_limit=None))
    p = GenerationParams(gen_length=model.config.canvas_length, block_length=model.config.canvas_length,
                         max_denoising_steps=steps, seed=0)
    gen = torch.Generator().manual_seed(1)
    for i in range(batch):
        engine.add_request(torch.randint(0, V - 2, (prompt,), generator=gen).tolist(), p, request_id=f"r{i}")
    import time

    walls = []
    while engine.has_unfinished():
        t0 = time.perf_counter()
        engine.step()
        walls.append(time.perf_counter() - t0)
    encode = [r.seconds for r in engine.trace if r.kind == "encode"]
    denoise = [r.seconds for r in engine.trace if r.kind == "full"]
    reqs = list(engine.requests.values())
    return {"encode_ms": 1e3 * sum(encode), "denoise_step_ms": 1e3 * statistics.median(denoise[1:] or denoise),
            "engine_step_ms": 1e3 * statistics.median(walls[1:] or walls),
            "forwards_per_canvas": statistics.mean(q.nfe for q in reqs), "denoise_steps": len(denoise)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--steps", type=int, default=8, help="denoising steps per canvas (random weights never stop)")
    ap.add_argument("--canvases", default="256,32")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--shapes", default="tiny,25m-moe")
    ap.add_argument("--out", default="benchmarks/results/renoise_step_cpu.json")
    a = ap.parse_args()
    writable_folder(Path(a.out).parent, "--out")
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    hw = measure_cpu()
    rows = []
    for shape in a.shapes.split(","):
        for canvas in map(int, a.canvases.split(",")):
            model = build(shape, canvas)
            arch = model.config
            roof = rl.Roofline(hw, rl.ModelCost.from_arch(arch, 4.0, attention=True))
            for b in map(int, a.batches.split(",")):
                m = run(model, b, a.prompt, a.steps)
                table = rt.renoise_table(roof, arch, a.prompt, steps=(a.steps,), batches=(b,))["rows"][0]
                row = {"shape": shape, "parameters": arch.num_parameters(),
                       "active_parameters": arch.num_parameters(active=True), "canvas": canvas, "batch": b,
                       **m, "predicted_denoise_step_ms": table["denoise_step_ms"],
                       "predicted_encode_canvas_ms": table["encoder_ms"],
                       "experts_read_per_layer": table["experts_read_per_layer"],
                       "tokens_per_s_measured": b * canvas / ((m["denoise_step_ms"] * a.steps) / 1e3),
                       "tokens_per_s_predicted": table["tokens_per_s"]}
                rows.append(row)
                print(f"{shape:8s} canvas {canvas:4d} batch {b}: denoise step {m['denoise_step_ms']:8.1f} ms "
                      f"(predicted {row['predicted_denoise_step_ms']:7.2f}), engine step {m['engine_step_ms']:8.1f} ms, "
                      f"encoder pass (prompt {a.prompt}) {m['encode_ms']:7.1f} ms, experts/layer "
                      f"{row['experts_read_per_layer']:.1f}", flush=True)
    out = {"context": context(), "hardware_measured": hw.__dict__, "setup": vars(a),
           "timing": "per denoising step: the batched denoiser forward and the sampler (engine trace); the engine "
                     "step adds admission and bookkeeping; random weights, so forwards per canvas = --steps",
           "rows": rows}
    write_json_atomic(a.out, out)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
