"""Roofline cost model for AR and diffusion decoding (seed 000's accounting).

A forward over n positions reads the weights once and computes about 2N FLOPs per position, so
it costs at least  T(n) = max(weight_bytes / bandwidth, n * 2N / peak_flops).  Optionally the
KV cache read and the attention FLOPs are added (reads to the memory term, FLOPs to the compute
term). From T(n):

- AR, one request:       prefill T(P) + G * T(1)
- diffusion, no cache:   (G / tau) * T(P + G)                       every step recomputes the canvas
- block diffusion+cache: T(P) + (G / tau) * T(block) [+ blocks * T(block) seal forwards]
- b concurrent requests: AR b / T(b) tok/s; diffusion tau * b / T(g * b) with g positions per step.

It ignores the fixed cost of each call (kernel launches, framework overhead), which dominates
small models on a CPU, so it is a lower bound there. On the 2-core development machine: about
25 ms of every forward of the 25 M-parameter random-weight model of benchmarks/step_time.py, and
most of the 5-18 ms step of the 3.4 M embedded model, where `unmask bench` finds the prediction
48-93 % below the measurement.
"""

import math
from dataclasses import dataclass

from unmask.bench.hardware import PRESETS, WEIGHTS, Hardware, measure_cpu
from unmask.files import save_figure


@dataclass(frozen=True)
class ModelCost:
    weight_bytes: float
    flops_per_position: float  # about 2N (2 x the active parameters of a mixture of experts)
    # optional attention terms (per layer and position of context)
    num_layers: int = 0
    kv_dim: int = 0  # n_kv_heads * head_dim
    q_dim: int = 0  # n_heads * head_dim
    kv_bytes_per_element: float = 2.0
    # mixture of experts: a forward reads the shared weights and, in each MoE layer, only the
    # routed experts its positions chose (`distinct_experts`)
    moe_layers: int = 0
    num_experts: int = 0
    top_k: int = 0
    expert_bytes: float = 0.0  # one routed expert of one layer

    def distinct_experts(self, positions: float) -> float:
        """Expected routed experts one MoE layer reads for `positions` tokens, each choosing top_k
        of num_experts uniformly: E (1 - (1 - k/E)^n). Real routers are skewed and the positions of
        one block correlated, so fewer are read: this is the cost's upper side."""
        if not self.moe_layers:
            return 0.0
        E, k = self.num_experts, self.top_k
        return E * (1 - (1 - k / E) ** positions)

    def read_bytes(self, positions: float) -> float:
        """Weight bytes a forward over `positions` positions (all rows) reads."""
        if not self.moe_layers:
            return self.weight_bytes
        routed = self.moe_layers * self.num_experts * self.expert_bytes
        return self.weight_bytes - routed + self.moe_layers * self.distinct_experts(positions) * self.expert_bytes

    @classmethod
    def seed_7b(cls) -> "ModelCost":
        """Seed 000's teaching model: 7B parameters in bf16 (1.4e10 bytes, 2N = 1.4e10 FLOPs)."""
        return cls(1.4e10, 1.4e10)

    @classmethod
    def from_arch(cls, arch, bytes_per_param: float = 2.0, attention: bool = False,
                  float_bytes: float | None = None) -> "ModelCost":
        """`float_bytes`: the bytes per parameter of what int8 quantization leaves in floating point
        (the embedding, the head, the grouped experts of a mixture of experts, unmask.layers.quant);
        the other weights take `bytes_per_param`. KV entries stay in the float dtype."""
        n = arch.num_parameters(embeddings=True)
        # the input embedding is a lookup: it is read but costs no FLOPs (a tied head still multiplies)
        flops = 2 * arch.num_parameters(embeddings=True, active=True)
        if not arch.tie_embeddings:
            flops -= 2 * arch.vocab_size * arch.hidden_size
        kw = {}
        fb = bytes_per_param if float_bytes is None else float_bytes
        if attention:
            kw = dict(num_layers=arch.num_layers, kv_dim=arch.num_kv_heads * arch.head_dim,
                      q_dim=arch.num_heads * arch.head_dim, kv_bytes_per_element=fb)
        m = arch.moe
        kept = arch.vocab_size * arch.hidden_size * (1 if arch.tie_embeddings else 2)
        if m is not None:
            experts = m.layers_moe(arch.num_layers) * m.num_experts * 3 * arch.hidden_size * m.expert_size
            kept += experts
            kw.update(moe_layers=m.layers_moe(arch.num_layers), num_experts=m.num_experts, top_k=m.top_k,
                      expert_bytes=3 * arch.hidden_size * m.expert_size * fb)
        return cls((n - kept) * bytes_per_param + kept * fb, flops, **kw)


@dataclass(frozen=True)
class Roofline:
    hw: Hardware
    model: ModelCost

    def step(self, positions: float, context: float = 0, batch: int = 1) -> float:
        """Seconds for one forward over `positions` query positions in total (all rows), each
        attending to `context` keys, with `batch` rows sharing the weight read."""
        m = self.model
        memory = m.read_bytes(positions)
        compute = positions * m.flops_per_position
        if m.num_layers and context:
            memory += batch * context * m.num_layers * 2 * m.kv_dim * m.kv_bytes_per_element
            compute += positions * m.num_layers * 4 * context * m.q_dim
        return max(memory / self.hw.bandwidth, compute / self.hw.peak_flops)

    # ---- one request
    def ar_latency(self, prompt: int, gen: int) -> float:
        decode = sum(self.step(1, prompt + i) for i in range(gen)) if self.model.num_layers else gen * self.step(1)
        return self.step(prompt, prompt) + decode

    def diffusion_latency(self, prompt: int, gen: int, tau: float) -> float:
        """No cache: every step recomputes prompt + gen positions."""
        L = prompt + gen
        return math.ceil(gen / tau) * self.step(L, L)

    def block_latency(self, prompt: int, gen: int, tau: float, block: int, seal_forwards: bool = False) -> float:
        """Block diffusion with an exact cache: prefill, then `block` positions per step; with
        `seal_forwards`, one extra forward per block to write it into the cache."""
        L = prompt + gen
        steps = math.ceil(gen / tau) + (gen // block if seal_forwards else 0)
        return self.step(prompt, prompt) + steps * self.step(block, L)

    # ---- b concurrent requests, decode phase
    def ar_throughput(self, batch: int, context: int = 0) -> float:
        return batch / self.step(batch, context, batch)

    def diffusion_throughput(self, batch: int, tau: float, positions_per_step: int, context: int = 0) -> float:
        return tau * batch / self.step(positions_per_step * batch, context, batch)

    def crossover(self, tau: float, positions_per_step: int, context: int = 0, max_batch: int = 4096) -> int | None:
        """Smallest batch at which AR throughput reaches the diffusion throughput."""
        for b in range(1, max_batch + 1):
            if self.ar_throughput(b, context) >= self.diffusion_throughput(b, tau, positions_per_step, context):
                return b
        return None


def seed_example() -> str:
    """Seed 000's worked example, recomputed: H100 SXM, 7B bf16, prompt 512, gen 256."""
    r = Roofline(PRESETS["h100-sxm"], ModelCost.seed_7b())
    ms = lambda s: f"{s * 1e3:.0f} ms"  # noqa: E731
    lines = [
        f"hardware: {r.hw.name}; model: 7B bf16 (1.4e10 bytes, 2N = 1.4e10 FLOPs)",
        f"weight read {r.step(1) * 1e3:.2f} ms; compute per position {1.4e10 / r.hw.peak_flops * 1e3:.5f} ms; "
        f"the two meet at n = {r.model.weight_bytes / r.hw.bandwidth / (1.4e10 / r.hw.peak_flops):.0f} positions",
        "",
        "one request, prompt 512, gen 256:",
        f"  AR with KV cache (prefill + 256 steps)           {ms(r.ar_latency(512, 256))}",
        f"  diffusion, no cache, 1 token/step (256 x 768)    {ms(r.diffusion_latency(512, 256, 1))}",
        f"  diffusion, no cache, 4 tokens/step (64 x 768)    {ms(r.diffusion_latency(512, 256, 4))}",
        f"  block diffusion + cache, block 32, tau 4         {ms(r.block_latency(512, 256, 4, 32))}",
        f"    + one seal forward per block (8 blocks)      {ms(r.block_latency(512, 256, 4, 32, True))}",
        "",
        "concurrent requests (decode), block diffusion G = 32, tau = 4:",
        f"  {'batch':>6} {'AR tok/s':>10} {'diffusion tok/s':>16}",
    ]
    for b in (1, 8, 9, 37, 64, 295):
        lines.append(f"  {b:6d} {r.ar_throughput(b):10.0f} {r.diffusion_throughput(b, 4, 32):16.0f}")
    lines += [
        f"  caps: AR {1 / (r.model.flops_per_position / r.hw.peak_flops):.0f} tok/s, diffusion "
        f"{4 / (32 * r.model.flops_per_position / r.hw.peak_flops):.0f} tok/s (= AR cap x tau / G)",
        f"  AR catches up at batch {r.crossover(4, 32)}",
    ]
    return "\n".join(lines)


def build(hardware: str | None = None, arch=None, params: float | None = None,
          bytes_per_param: float | None = None, attention: bool = False, weights: str | None = None) -> Roofline:
    """A roofline for named hardware (a preset, or "cpu": this machine, measured) and a model given
    by its architecture (`arch`, an ArchConfig) or by its parameter count. Bad values raise an
    UnmaskError that names them."""
    from unmask.errors import UnmaskError

    if hardware is not None and hardware != "cpu" and hardware not in PRESETS:
        raise UnmaskError(f"unknown hardware {hardware!r}; choose {', '.join(PRESETS)} or cpu")
    if arch is not None and params is not None:
        raise UnmaskError("give a model or a parameter count, not both")
    if attention and arch is None:
        raise UnmaskError("attention costs need a model (the layer and head sizes come from its config)")
    if weights is not None and weights not in WEIGHTS:
        raise UnmaskError(f"weights {weights!r}: choose {', '.join(WEIGHTS)}")
    if weights is not None and hardware != "cpu":
        raise UnmaskError(f"weights {weights}: the measured weight types are this CPU's (--hardware cpu); the GPU "
                          "presets price bf16 (--bytes-per-param for another width)")
    if bytes_per_param is None:
        bytes_per_param = WEIGHTS[weights or "float32"] if hardware == "cpu" else 2.0
    if not (math.isfinite(bytes_per_param) and bytes_per_param > 0):
        raise UnmaskError(f"bytes per parameter {bytes_per_param} must be a finite number > 0")
    hw = measure_cpu(weights=weights or "float32") if hardware == "cpu" else PRESETS[hardware or "h100-sxm"]
    float_bytes = 4.0 if weights == "int8" else None  # what int8 quantization leaves in float32
    if arch is not None:
        return Roofline(hw, ModelCost.from_arch(arch, bytes_per_param, attention, float_bytes))
    n = 7e9 if params is None else params
    if not (math.isfinite(n) and n > 0):
        raise UnmaskError(f"parameter count {n} must be a finite number > 0")
    return Roofline(hw, ModelCost(n * bytes_per_param, 2 * n))


def moe_table(r: Roofline, context: int, blocks=(1, 4, 8, 16, 32, 64), batches=(1, 8, 64)) -> list[dict]:
    """Step time of one forward over G positions per request at each batch, with the routed experts
    it reads per MoE layer: G = 1 is an AR step, G = 32 a block-diffusion step."""
    rows = []
    for b in batches:
        for g in blocks:
            n = g * b
            rows.append({"batch": b, "positions_per_request": g, "step_ms": 1e3 * r.step(n, context, b),
                         "experts_read_per_layer": r.model.distinct_experts(n),
                         "weight_gb_read": r.model.read_bytes(n) / 1e9})
    return rows


MIN_TAU = 0.01  # fewer tokens per forward than this is no decoder anyone runs (and overflows the counts)


def check_setup(prompt: int, gen: int, tau: float, block: int, batches: list[int]) -> None:
    from unmask.errors import UnmaskError

    for name, v in (("prompt", prompt), ("gen", gen), ("block", block)):
        if v < 1:
            raise UnmaskError(f"--{name} {v} must be a positive integer")
    if not (math.isfinite(tau) and tau >= MIN_TAU):
        raise UnmaskError(f"--tau {tau:g} must be a finite number >= {MIN_TAU:g} (tokens committed per forward)")
    if tau > block:  # a forward commits (or a verify accepts) at most the positions it computes
        raise UnmaskError(f"--tau {tau:g} exceeds --block {block}: a step commits at most the {block} positions it "
                          "computes (a DFlash verify accepts at most its block)")
    if tau > gen:
        raise UnmaskError(f"--tau {tau:g} exceeds --gen {gen}: a request commits {gen} tokens in all")
    if not batches or any(b < 1 for b in batches):
        raise UnmaskError(f"--batches {batches} must be positive integers")


def predict(r: Roofline, prompt: int, gen: int, tau: float, block: int, batches: list[int]) -> dict:
    """Latency of one request and decode throughput at each batch, for AR and diffusion."""
    check_setup(prompt, gen, tau, block, batches)
    ctx = prompt + gen if r.model.num_layers else 0
    return {
        "hardware": r.hw.__dict__,
        "model": r.model.__dict__,
        "setup": {"prompt": prompt, "gen": gen, "tau": tau, "block": block},
        "latency_ms": {
            "ar": 1e3 * r.ar_latency(prompt, gen),
            "diffusion_no_cache": 1e3 * r.diffusion_latency(prompt, gen, tau),
            "block_cache": 1e3 * r.block_latency(prompt, gen, tau, block),
            "block_cache_seal_forwards": 1e3 * r.block_latency(prompt, gen, tau, block, True),
        },
        "throughput_tok_s": [
            {"batch": b, "ar": r.ar_throughput(b, ctx), "diffusion": r.diffusion_throughput(b, tau, block, ctx)}
            for b in batches
        ],
        "crossover_batch": r.crossover(tau, block, ctx),
        **({"moe": {"active_parameters_flops_per_position": r.model.flops_per_position,
                    "experts": r.model.num_experts, "top_k": r.model.top_k, "moe_layers": r.model.moe_layers,
                    "steps": moe_table(r, ctx)}} if r.model.moe_layers else {}),
    }


def format_prediction(p: dict) -> str:
    s, lat = p["setup"], p["latency_ms"]
    lines = [
        f"hardware: {p['hardware']['name']} ({p['hardware']['bandwidth'] / 1e9:.0f} GB/s, "
        f"{p['hardware']['peak_flops'] / 1e12:.2f} TFLOP/s); weights {p['model']['weight_bytes'] / 1e6:.3g} MB",
        f"one request, prompt {s['prompt']}, gen {s['gen']}, tau {s['tau']}, block {s['block']}:",
        f"  AR {lat['ar']:.1f} ms | diffusion no cache {lat['diffusion_no_cache']:.1f} ms | "
        f"block + cache {lat['block_cache']:.1f} ms ({lat['block_cache_seal_forwards']:.1f} with seal forwards)",
        f"  {'batch':>6} {'AR tok/s':>12} {'diffusion tok/s':>16}",
    ]
    for row in p["throughput_tok_s"]:
        lines.append(f"  {row['batch']:6d} {row['ar']:12.0f} {row['diffusion']:16.0f}")
    lines.append(f"  AR catches up at batch {p['crossover_batch']}")
    if "moe" in p:
        m = p["moe"]
        lines += [f"mixture of experts: {m['moe_layers']} MoE layers, top {m['top_k']} of {m['experts']} experts "
                  "(uniform routing assumed: the experts-read column is an upper side)",
                  f"  {'batch':>6} {'G':>4} {'step ms':>9} {'experts read/layer':>19} {'weights read GB':>16}"]
        for row in m["steps"]:
            lines.append(f"  {row['batch']:6d} {row['positions_per_request']:4d} {row['step_ms']:9.2f} "
                         f"{row['experts_read_per_layer']:19.1f} {row['weight_gb_read']:16.2f}")
    return "\n".join(lines)


def plot_prediction(r: Roofline, p: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = p["setup"]
    ctx = s["prompt"] + s["gen"] if r.model.num_layers else 0
    bs = sorted({int(round(x)) for x in (2 ** (i / 4) for i in range(0, 4 * 12 + 1))})
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(bs, [r.ar_throughput(b, ctx) for b in bs], label="AR with KV cache")
    ax.plot(bs, [r.diffusion_throughput(b, s["tau"], s["block"], ctx) for b in bs],
            label=f"block diffusion (G={s['block']}, tau={s['tau']})")
    if p["crossover_batch"]:
        ax.axvline(p["crossover_batch"], color="grey", ls=":", label=f"crossover b={p['crossover_batch']}")
    ax.set(xscale="log", yscale="log", xlabel="concurrent requests", ylabel="decode tokens/s",
           title=f"Roofline: {p['hardware']['name']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)
