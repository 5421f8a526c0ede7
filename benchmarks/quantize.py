"""Per-forward time of one denoising step, float32 (PyTorch's default kernel and the per-shape
choice of unmask.layers.dispatch) against int8 (unmask.layers.quant), and what it means for an 8B
model on this CPU.

A step here is what the engine runs under DualCache: a forward over G canvas positions per row
(G = 1 is an autoregressive step, G = 8 / 32 a block-diffusion step) attending to a cached prefix
of `--prefix` columns, plus the head over those G positions. Timed: the model's forward only
(no proposal, no commit policy), best of `--repeats` after a warm-up, per batch 1 and 8.

Shapes (random weights; LLaDA architecture):
  - "25M": the step-time benchmark's (8 layers, d 512, 8 heads, ff 1376, vocab 512);
  - "8B-layers": LLaDA-8B's hidden sizes (d 4096, 32 heads, ff 12288) and real vocabulary
    (126464, embedding and head), `--big-layers` of its 32 layers; the 32-layer step is projected
    as head + 32 x the forward without the head (logits at no position) over the layers measured
    (labelled a projection in the JSON).
`--full` instead builds all 32 layers of the 8B shape directly in int8 (random int8 weights, never
a float copy: ~11 GB; `--full-method int4`: int4 layers, int8 embedding and head, ~4.4 GB) and
decodes a 256-token canvas through the engine (DualCache, blocks of 32,
a fixed schedule), reporting seconds per step and peak RSS.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/quantize.py            # -> benchmarks/results/quantize_cpu.json
    OMP_WAIT_POLICY=PASSIVE python benchmarks/quantize.py --full     # -> benchmarks/results/quantize_8b_full_cpu.json
    OMP_WAIT_POLICY=PASSIVE python benchmarks/quantize.py --full --full-method int4
                                                            # -> benchmarks/results/quantize_8b_full_int4_cpu.json
"""

import argparse
import gc
import os
import resource
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from unmask.bench.runner import context  # noqa: E402
from unmask.kv.static import StaticKV  # noqa: E402
from unmask.files import write_json_atomic  # noqa: E402
from unmask.layers.dispatch import NEVER, OneDNNLinear, choices, use_kernels  # noqa: E402
from unmask.layers.quant import Int8Linear, quantize_model, targets  # noqa: E402
from unmask.models.base import ArchConfig  # noqa: E402
from unmask.models.llada import LLaDAModel  # noqa: E402

SHAPES = {"25M": dict(layers=8, d=512, heads=8, ff=1376, vocab=512),
          "8B-layers": dict(layers=2, d=4096, heads=32, ff=12288, vocab=126464)}
VARIANTS = ("float32-default", "float32-auto", "int8")  # --variants float32-auto,int8,int4: int4 against int8
GPU_VARIANTS = ("bfloat16", "int8-torchao", "fp8-torchao")  # --device cuda (benchmarks/gpu_check.sh)


def arch(layers, d, heads, ff, vocab) -> ArchConfig:
    return ArchConfig("llada", vocab, d, layers, heads, heads, ff, 500000.0, 1e-5, 8192)


@torch.no_grad()
def build(shape: dict, variant: str, seed: int = 0, device: str = "cpu") -> LLaDAModel:
    torch.manual_seed(seed)
    with torch.device("meta"):
        model = LLaDAModel(arch(**shape))
    model = model.to_empty(device=device)
    for p in model.parameters():
        p.normal_(0, 0.02) if p.dim() == 2 else p.fill_(1.0)
    model.eval()
    if variant in GPU_VARIANTS:  # bf16, then torchao's int8 weight-only or fp8 (unmask.layers.torchao_quant)
        from unmask.layers.torchao_quant import quantize_torchao

        model = model.to(torch.bfloat16)
        if variant != "bfloat16":
            quantize_torchao(model, variant.split("-")[0], model.parts()[3])
    elif variant == "float32-auto":
        use_kernels(model, "auto")
    elif variant in ("int8", "int4"):
        quantize_model(model, variant, model.parts()[3])
        use_kernels(model, "auto")  # the head, float by choice, on the per-shape kernel too
    gc.collect()
    return model


def weight_bytes(model: nn.Module) -> int:
    n = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    n += sum(m.weight_bytes for m in model.modules() if isinstance(m, Int8Linear))  # (int4 layers' are buffers)
    return n + sum(m.packed_bytes for m in model.modules() if isinstance(m, OneDNNLinear))


@torch.inference_mode()
def step_ms(model, batch: int, g: int, prefix: int, repeats: int) -> tuple[float, float, float]:
    """(ms per forward of g positions per row over a cached prefix, of its head alone, of the
    forward without the head: logits at no position)"""
    c = model.config
    device = next(model.parameters()).device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    kv = StaticKV(c.num_layers, prefix + g)
    ids = torch.randint(0, c.vocab_size, (batch, prefix + g), device=device)
    pos = torch.arange(prefix + g, device=device)[None].expand(batch, -1)
    model(ids[:, :prefix], pos[:, :prefix], kv, 0)  # fill the cache (not timed)
    x, p = ids[:, prefix:], pos[:, prefix:]
    head = model.parts()[3]
    hidden = torch.randn(batch, g, c.hidden_size, device=device, dtype=next(model.parameters()).dtype)
    best = best_head = best_body = float("inf")
    model(x, p, kv, prefix)
    head(hidden)
    model(x, p, kv, prefix, logits_slice=slice(0, 0))
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        model(x, p, kv, prefix)
        sync()
        best = min(best, time.perf_counter() - t)
        t = time.perf_counter()
        head(hidden)
        sync()
        best_head = min(best_head, time.perf_counter() - t)
        t = time.perf_counter()
        model(x, p, kv, prefix, logits_slice=slice(0, 0))
        sync()
        best_body = min(best_body, time.perf_counter() - t)
    return best * 1e3, best_head * 1e3, best_body * 1e3


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def layers_run(a) -> dict:
    """Every variant of a shape built side by side and timed interleaved (repeat by repeat), so a
    drift of the machine's speed hits all three alike."""
    rows = []
    variants = (tuple(a.variants.split(",")) if a.variants else VARIANTS) if a.device == "cpu" else GPU_VARIANTS
    for name in a.shapes.split(","):
        shape = SHAPES[name] if name != "8B-layers" else dict(SHAPES[name], layers=a.big_layers)
        models = {v: build(shape, v, device=a.device) for v in variants}
        plan = ({f"{k[0]}x{k[1]}": v if v < NEVER else None for k, v in choices(models["float32-default"]).items()}
                if "float32-default" in models else None)
        repeats = a.repeats if name == "25M" else max(2, a.repeats // 2)
        for batch in (1, 8):
            for g in (1, 8, 32):
                best = {v: (float("inf"),) * 3 for v in variants}
                for _ in range(repeats):
                    for v, model in models.items():
                        best[v] = tuple(map(min, best[v], step_ms(model, batch, g, a.prefix, 1)))
                for v, (ms, head, body) in best.items():
                    row = {"shape": name, "variant": v, "batch": batch, "positions": g, "ms_per_forward": round(ms, 3),
                           "ms_head": round(head, 3), "positions_per_s": round(batch * g / ms * 1e3, 1),
                           "weight_bytes": weight_bytes(models[v])}
                    if name == "8B-layers" and shape["layers"] < 32:
                        row["ms_without_head"] = round(body, 3)  # embedding, the layers, the final norm
                        row["projected_32_layer_ms"] = round(head + 32 * body / shape["layers"], 1)
                    rows.append(row)
                    print(f"{name:9} {v:16} b{batch} G{g:<3} {ms:9.2f} ms/forward  head {head:8.2f} ms"
                          + (f"  -> 32 layers {row['projected_32_layer_ms']:8.1f} ms (projection)" if "projected_32_layer_ms"
                             in row else ""), flush=True)
        rows[-1]["auto_plan_from_rows"] = plan
        del models
        gc.collect()
    return {"device": a.device, "rows": rows, **summarize(rows, a.shapes.split(","), variants),
            "peak_rss_bytes": peak_rss()}


def summarize(rows: list[dict], shapes, variants=VARIANTS) -> dict:
    """Speed-ups between the variants ("a/b": a's time over b's; measured forwards, and for a
    partial 8B-layers model the 32-layer projections) and each variant's G = 8 step against its
    G = 1 step at batch 1."""
    out = {"speedups": {}, "g8_over_g1": {}}
    base, mid, last = variants
    for name in shapes:
        for key in ("ms_per_forward", "projected_32_layer_ms"):
            t = {(r["variant"], r["batch"], r["positions"]): r[key] for r in rows if r["shape"] == name and key in r}
            if not t:
                continue
            tag = name if key == "ms_per_forward" else f"{name} projected to 32 layers"
            for batch in (1, 8):
                for g in (1, 8, 32):
                    d, o, q = (t[(v, batch, g)] for v in variants)
                    out["speedups"][f"{tag} b{batch} G{g}"] = {f"{base}/{last}": round(d / q, 2),
                                                              f"{mid}/{last}": round(o / q, 2),
                                                              f"{base}/{mid}": round(d / o, 2)}
            for v in variants:
                out["g8_over_g1"][f"{tag} {v}"] = round(t[(v, 1, 8)] / t[(v, 1, 1)], 2)
    return out


@torch.no_grad()
def build_8b(layers: int = 32, method: str = "int8", seed: int = 0) -> LLaDAModel:
    """All `layers` of LLaDA-8B's shape with random quantized weights made layer by layer (no float
    copy): int8 linear layers and a float32 embedding and head, or int4 linear layers (random
    nibbles and group scales) with the int8 head and embedding `--quantize int4` gives an untied
    model."""
    from unmask.layers.int4 import GROUP, Int4Linear
    from unmask.layers.quant import Int8Embedding, trim_heap

    shape = dict(SHAPES["8B-layers"], layers=layers)
    torch.manual_seed(seed)
    with torch.device("meta"):
        model = LLaDAModel(arch(**shape))
    embed, _, _, head = model.parts()
    names = targets(model, head)
    step = 0.02 * 1.7 / 127  # int8 steps of ~N(0, 0.02) weights' range

    def rand(low: int, high: int, out: int, cols: int, dtype) -> torch.Tensor:
        """Random integers made 4096 rows at a time (randint draws in int64 first: 4 GB for the head)."""
        t = torch.empty(out, cols, dtype=dtype)
        for i in range(0, out, 4096):
            t[i : i + 4096] = torch.randint(low, high, (min(4096, out - i), cols), dtype=dtype)
        return t

    def int8(out: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
        return rand(-127, 128, out, cols, torch.int8), torch.full((out,), step)

    for name in names:
        m = model.get_submodule(name)
        if method == "int4":
            nibbles = rand(0, 16, m.out_features, m.in_features, torch.uint8)
            scales = torch.full((m.out_features, m.in_features // GROUP), 0.02 * 1.7 / 8)
            layer = Int4Linear(nibbles, scales)
            del nibbles
        else:
            layer = Int8Linear.from_int8(*int8(m.out_features, m.in_features), None)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, layer)
        trim_heap()
    if method == "int4":
        pair = {id(m): n for n, m in model.named_modules()}
        for module, made in ((embed, Int8Embedding(*int8(embed.num_embeddings, embed.embedding_dim))),
                             (head, Int8Linear.from_int8(*int8(head.out_features, head.in_features), None))):
            parent, _, child = pair[id(module)].rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, made)
            trim_heap()
    for m in model.modules():  # what is left on meta: embedding, head, norms (not the int8 layers' buffers)
        if any(p.is_meta for p in m.parameters(recurse=False)):
            m.to_empty(device="cpu", recurse=False)
            for p in m.parameters(recurse=False):
                p.normal_(0, 0.02) if p.dim() == 2 else p.fill_(1.0)
    use_kernels(model, "auto")
    return model.eval()


def full_run(a) -> dict:
    from unmask.engine import Engine, EngineConfig
    from unmask.models.base import TokenIds
    from unmask.params import GenerationParams

    t = time.perf_counter()
    model = build_8b(a.full_layers, a.full_method)
    built = time.perf_counter() - t
    rss_model = peak_rss()
    print(f"built the {a.full_layers}-layer {a.full_method} model in {built:.0f} s; "
          f"weights {weight_bytes(model) / 2**30:.2f} GiB; "
          f"peak RSS {rss_model / 2**30:.2f} GiB", flush=True)
    v = model.config.vocab_size
    tokens = TokenIds(mask=v - 1, eos=v - 2, pad=v - 2, stop=(v - 2,))
    steps = a.gen // a.per_step
    params = GenerationParams(gen_length=a.gen, block_length=32, steps=steps, cache="dual", early_stop=False).check()
    engine = Engine(model, tokens, EngineConfig(max_num_seqs=1, trace_limit=None))
    prompt = torch.randint(0, v - 3, (a.prefix,), generator=torch.Generator().manual_seed(0)).tolist()
    engine.add_request(prompt, params)
    times = []
    while engine.has_unfinished():
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
        print(f"step {len(times)}: {times[-1]:.2f} s", flush=True)
        if a.max_steps and len(times) >= a.max_steps:
            break
    first, rest = times[0], times[1:]
    per = sum(rest) / len(rest)
    ends = "int8 embedding and head" if a.full_method == "int4" else "float32 embedding and head"
    out = {"model": f"LLaDA-8B shape, {a.full_layers} layers, {a.full_method} linear layers (random weights), {ends}",
           "prompt": a.prefix, "gen_length": a.gen, "block_length": 32, "cache": "dual",
           "schedule_tokens_per_step": a.per_step, "steps_run": len(times), "build_seconds": round(built, 1),
           "weight_bytes": weight_bytes(model), "peak_rss_bytes": peak_rss(), "peak_rss_after_build_bytes": rss_model,
           "rss_at_end_bytes": 1024 * int(next(x for x in open("/proc/self/status") if x.startswith("VmRSS")).split()[1]),
           "first_step_seconds": round(first, 2), "seconds_per_step": round(per, 2),
           "timing": "engine.step wall time: forward, proposal, commit (batch 1); the first step includes the prompt's prefill"}
    for tau in a.tau:
        out.setdefault("projection", []).append(
            {"tokens_per_step": tau, "tokens_per_s": round(tau / per, 3),
             "note": "a projection: a real checkpoint's tokens per step at this τ, times this measured step"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="25M,8B-layers")
    ap.add_argument("--device", default="cpu", help="cpu (float32, dispatch, int8) or cuda (bf16, torchao int8 / fp8)")
    ap.add_argument("--big-layers", type=int, default=2)
    ap.add_argument("--variants", default=None, help=f"three of {', '.join(VARIANTS)}, int4 (default: the first three)")
    ap.add_argument("--prefix", type=int, default=256, help="cached prefix columns (the prompt and earlier blocks)")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--full", action="store_true", help="the 32-layer int8 8B-shaped decode instead")
    ap.add_argument("--full-layers", type=int, default=32)
    ap.add_argument("--full-method", default="int8", choices=("int8", "int4"))
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--per-step", type=int, default=2, help="fixed schedule: tokens committed per step")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: the whole canvas)")
    ap.add_argument("--tau", type=float, nargs="*", default=[1.0, 2.0, 3.0])
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    res = {"benchmark": "quantize", "context": context()}
    if a.full:
        res.update(full_run(a))
        out = a.out or f"benchmarks/results/quantize_8b_full{'' if a.full_method == 'int8' else '_int4'}_cpu.json"
    else:
        res.update({"prefix": a.prefix, "timing": "model forward only (DualCache window over a cached prefix), best of "
                    f"{a.repeats}; head timed alone on the same rows"}, **layers_run(a))
        out = a.out or f"benchmarks/results/quantize_{a.device}.json"
    write_json_atomic(Path(out), res)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
