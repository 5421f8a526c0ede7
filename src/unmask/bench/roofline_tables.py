"""What the roofline model (unmask.bench.roofline) says about the questions `unmask roofline` asks
beyond AR against diffusion: the time of one forward per block size and batch, a speculative
drafter's pay-off, tensor parallelism over a link, a renoising model's step count against AR,
and a mixture-of-experts model's active weights per block."""

from unmask.bench.hardware import Hardware
from unmask.bench.roofline import ModelCost, Roofline


def step_table(rooflines: dict, arch, context: int, positions=(1, 8, 32), batches=(1, 8)) -> dict:
    """Predicted ms of one forward of `arch` over G positions per row (G = 1: an autoregressive
    step; 8 / 32: a block-diffusion step) attending to `context` cached columns, per batch, for
    each named roofline (this CPU in float32 and int8, the GPU presets)."""
    out = {}
    for name, r in rooflines.items():
        out[name] = {"hardware": r.hw.name, "bandwidth": r.hw.bandwidth, "peak_flops": r.hw.peak_flops,
                     "weight_bytes": r.model.weight_bytes,
                     "ms": {f"b{b} G{g}": round(1e3 * r.step(g * b, context, b), 3) for b in batches for g in positions}}
    return out


def format_step_table(t: dict) -> str:
    cols = list(next(iter(t.values()))["ms"])
    lines = [f"{'':26}" + "".join(f"{c:>11}" for c in cols) + "   (ms per forward, predicted)"]
    for name, row in t.items():
        lines.append(f"{name:26}" + "".join(f"{row['ms'][c]:11.2f}" for c in cols))
    lines += [f"  {name}: {row['hardware']}, {row['bandwidth'] / 1e9:.1f} GB/s, {row['peak_flops'] / 1e12:.3g} "
              f"TFLOP/s, weights {row['weight_bytes'] / 1e9:.2f} GB" for name, row in t.items()]
    return "\n".join(lines)


def draft_cost(arch, layers: int, context_layers: int, bytes_per_param: float) -> ModelCost:
    """A DFlash drafter for target `arch`: `layers` decoder layers of the target's width and heads,
    the `fc` projection of `context_layers` target layers, and the target's head (its logits for
    the block's drafted positions; the embedding is a lookup). Per position: 2 x those parameters."""
    d, hd = arch.hidden_size, arch.head_dim
    layer = d * (arch.num_heads + 2 * arch.num_kv_heads) * hd + arch.num_heads * hd * d + 3 * d * arch.intermediate_size
    params = layers * layer + context_layers * d * d + arch.vocab_size * d
    return ModelCost(params * bytes_per_param, 2 * params)


def speculative_table(target: Roofline, draft: Roofline, prompt: int, block: int, taus=(2.0, 4.0, 6.0),
                      batches=(1, 8, 64)) -> dict:
    """DFlash decoding against the target alone, per request in the decode phase (context = prompt):
    a round is one drafter forward over the block (and the <= block new context positions it
    projects: counted as block more positions) plus one target forward over the block, and yields
    tau tokens; the target alone takes one forward per token. Rows share each forward's weight
    read (b rows: b x block positions per forward)."""
    from unmask.errors import UnmaskError

    over = [t for t in taus if not 0 < t <= block]
    if over:
        raise UnmaskError(f"tau {over[0]:g}: an acceptance length lies in (0, block {block}] (a verify accepts at "
                          "most the positions of its block)")
    rows = []
    for b in batches:
        ar = target.step(b, prompt, b)
        for tau in taus:
            d = draft.step(2 * block * b)
            v = target.step(block * b, prompt, b)
            rows.append({"batch": b, "tau": tau, "ar_ms_per_token": 1e3 * ar, "draft_ms": 1e3 * d, "verify_ms": 1e3 * v,
                         "ar_tokens_per_s": b / ar, "dflash_tokens_per_s": tau * b / (d + v),
                         "speedup": tau * ar / (d + v)})
    return {"block": block, "prompt": prompt, "draft_weight_gb": draft.model.weight_bytes / 1e9,
            "target_weight_gb": target.model.weight_bytes / 1e9, "rows": rows}


def format_speculative(t: dict, hw: Hardware) -> str:
    lines = [f"DFlash on {hw.name}: target {t['target_weight_gb']:.1f} GB, drafter {t['draft_weight_gb']:.2f} GB "
             f"(its layers, fc and the target's head), block {t['block']}, context {t['prompt']}",
             f"  {'batch':>5} {'tau':>5} {'AR ms/tok':>9} {'draft ms':>8} {'verify ms':>9} {'AR tok/s':>9} "
             f"{'DFlash tok/s':>12} {'speedup':>7}"]
    for r in t["rows"]:
        lines.append(f"  {r['batch']:5d} {r['tau']:5.1f} {r['ar_ms_per_token']:9.3f} {r['draft_ms']:8.3f} "
                     f"{r['verify_ms']:9.3f} {r['ar_tokens_per_s']:9.0f} {r['dflash_tokens_per_s']:12.0f} "
                     f"{r['speedup']:7.2f}")
    return "\n".join(lines)


# interconnect per GPU, one direction (NVLink 4 on H100 / H200: 900 GB/s both ways; NVLink 3 on
# A100: 600 GB/s), and a small all-reduce's latency inside one node (NCCL, a few microseconds
# per hop; 15 us assumed)
LINKS = {"h100-sxm": 450e9, "h200": 450e9, "a100-80gb": 300e9}


GPU_MEMORY = {"h100-sxm": 80e9, "h200": 141e9, "a100-80gb": 80e9}


ALL_REDUCE_LATENCY = 15e-6


def tp_table(r: Roofline, arch, link: float, worlds=(1, 2, 4, 8), shapes=None, context: int = 0,
             gpu_memory: float | None = None) -> dict:
    """Tensor (and expert) parallelism over N GPUs of one node: each rank reads 1/N of the weights
    and computes 1/N of the FLOPs, then all-reduces the (positions x hidden) activations after
    every row-parallel block (attention output, MLP or expert combine; DiffusionGemma's dense MLP
    and experts are reduced apart: 3 per layer), as a ring: 2 (N-1)/N of the bytes over the link,
    plus a fixed latency each; no overlap of communication with compute is assumed (the upper side).
    `shapes`: (label, positions, batch) forwards to price, default AR (1 x b), a block-diffusion
    step (32 x b) and a whole 256-position canvas (256 x b) at b = 1 and 64."""
    m = r.model
    bpe = m.kv_bytes_per_element if m.kv_dim else 2.0
    per_layer = 3 if getattr(arch.layout, "full_kv_heads", None) is not None else 2
    reduces = per_layer * arch.num_layers + 1  # + the vocabulary-parallel embedding
    shapes = shapes or [("AR step", 1, 1), ("block step (32)", 32, 1), ("canvas (256)", 256, 1),
                        ("AR step", 1, 64), ("block step (32)", 32, 64), ("canvas (256)", 256, 64)]
    rows = []
    for label, g, b in shapes:
        n = g * b
        base = None
        for w in worlds:
            memory = m.read_bytes(n) / w / r.hw.bandwidth
            compute = n * m.flops_per_position / w / r.hw.peak_flops
            if m.num_layers and context:
                memory += b * context * m.num_layers * 2 * m.kv_dim * bpe / w / r.hw.bandwidth
                compute += n * m.num_layers * 4 * context * m.q_dim / w / r.hw.peak_flops
            moved = n * arch.hidden_size * bpe
            comm = 0.0 if w == 1 else reduces * (ALL_REDUCE_LATENCY + 2 * (w - 1) / w * moved / link)
            total = max(memory, compute) + comm
            base = base or total
            rows.append({"forward": label, "positions": g, "batch": b, "ranks": w,
                         "weights_gb_per_rank": m.weight_bytes / w / 1e9,
                         "fits": gpu_memory is None or m.weight_bytes / w < 0.9 * gpu_memory, "compute_ms": 1e3 * max(memory, compute),
                         "bound": "memory" if memory >= compute else "compute", "comm_ms": 1e3 * comm,
                         "all_reduces": reduces if w > 1 else 0, "mb_per_all_reduce": moved / 1e6,
                         "step_ms": 1e3 * total, "speedup": base / total})
    return {"link_gb_s": link / 1e9, "all_reduce_latency_us": ALL_REDUCE_LATENCY * 1e6, "rows": rows}


def format_tp(t: dict, hw: Hardware) -> str:
    lines = [f"tensor parallel on {hw.name}: link {t['link_gb_s']:.0f} GB/s per GPU and direction, "
             f"{t['all_reduce_latency_us']:.0f} us per all-reduce; no compute/communication overlap",
             f"  {'forward':16} {'batch':>5} {'N':>3} {'GB/rank':>8} {'compute ms':>10} {'bound':>7} "
             f"{'comm ms':>8} {'step ms':>8} {'speedup':>7}"]
    for row in t["rows"]:
        lines.append(f"  {row['forward']:16} {row['batch']:5d} {row['ranks']:3d} {row['weights_gb_per_rank']:8.2f} "
                     f"{row['compute_ms']:10.3f} {row['bound']:>7} {row['comm_ms']:8.3f} {row['step_ms']:8.3f} "
                     f"{row['speedup']:7.2f}" + ("" if row["fits"] else "  (weights do not fit one GPU)"))
    return "\n".join(lines)


def renoise_table(r: Roofline, arch, prompt: int, steps=(4, 8, 16, 24, 32, 48), batches=(1, 8, 64)) -> dict:
    """A renoising model (DiffusionGemma): per canvas of L positions, one encoder pass over the new
    tokens (the previous canvas) and S denoising steps over the canvas, each reading the experts
    its b*L positions touch and computing, per position, the active parameters plus the
    self-conditioning's soft embedding (2 V d); tau = L / S. Beside it, the same weights decoding
    one token per forward (AR). Context attention only with --attention."""
    L = arch.canvas_length
    soft = 2 * arch.vocab_size * arch.hidden_size  # softmax(previous logits) @ embedding, per position
    out = []
    for b in batches:
        ctx = prompt + L if r.model.num_layers else 0
        enc = r.step(b * L, ctx, b)
        m = r.model
        den = max(m.read_bytes(b * L) / r.hw.bandwidth + (b * ctx * m.num_layers * 2 * m.kv_dim
                                                           * m.kv_bytes_per_element / r.hw.bandwidth if ctx else 0),
                  (b * L * (m.flops_per_position + soft)
                   + (b * L * m.num_layers * 4 * ctx * m.q_dim if ctx else 0)) / r.hw.peak_flops)
        ar = r.step(b, ctx, b)
        for s in steps:
            canvas = enc + s * den
            out.append({"batch": b, "steps_per_canvas": s, "tau": L / s, "encoder_ms": 1e3 * enc,
                        "denoise_step_ms": 1e3 * den, "experts_read_per_layer": m.distinct_experts(b * L),
                        "canvas_ms": 1e3 * canvas, "tokens_per_s": b * L / canvas, "ar_tokens_per_s": b / ar})
    return {"canvas": L, "prompt": prompt, "rows": out,
            "break_even_steps": {b: _break_even(r, arch, b, prompt, soft) for b in batches}}


def _break_even(r: Roofline, arch, b: int, prompt: int, soft: float) -> float:
    """Denoising steps per canvas at which the renoising model's tokens/s equals AR's."""
    L = arch.canvas_length
    ctx = prompt + L if r.model.num_layers else 0
    m = r.model
    enc = r.step(b * L, ctx, b)
    den = max(m.read_bytes(b * L) / r.hw.bandwidth, b * L * (m.flops_per_position + soft) / r.hw.peak_flops)
    ar_canvas = L * r.step(b, ctx, b)  # seconds for AR to write L tokens per row
    return (ar_canvas - enc) / den


def own_cost(r: Roofline, arch, prompt: int, batches) -> tuple[dict, str] | None:
    """A model whose decoding is priced apart from the AR-against-masked prediction, as (its table,
    that table as text): a renoising model's cost per canvas; None for any other model."""
    if arch is None or arch.kind != "renoise":
        return None
    table = renoise_table(r, arch, prompt, batches=batches)
    return table, format_renoise(table, r.hw, r.model.weight_bytes)


def format_renoise(p: dict, hw: Hardware, weight_bytes: float) -> str:
    lines = [f"hardware: {hw.name} ({hw.bandwidth / 1e9:.0f} GB/s, {hw.peak_flops / 1e12:.2f} TFLOP/s); weights "
             f"{weight_bytes / 1e9:.3g} GB; canvas {p['canvas']}, prompt {p['prompt']} (uniform routing: experts "
             "read are an upper side)",
             f"  {'batch':>5} {'steps':>5} {'tau':>6} {'enc ms':>8} {'step ms':>8} {'experts/layer':>13} "
             f"{'canvas ms':>10} {'tok/s':>9} {'AR tok/s':>9}"]
    for row in p["rows"]:
        lines.append(f"  {row['batch']:5d} {row['steps_per_canvas']:5d} {row['tau']:6.1f} {row['encoder_ms']:8.2f} "
                     f"{row['denoise_step_ms']:8.2f} {row['experts_read_per_layer']:13.1f} {row['canvas_ms']:10.1f} "
                     f"{row['tokens_per_s']:9.0f} {row['ar_tokens_per_s']:9.0f}")
    for b, s in p["break_even_steps"].items():
        lines.append(f"  batch {b}: renoising matches AR at {s:.1f} denoising steps per canvas (fewer: faster)")
    return "\n".join(lines)
