"""Open-loop load benchmark of `unmask serve` (loopback only, bounded in count and time).

For each mode (the diffusion model with continuous batching; with static batching, where a batch
is admitted only when the running one has drained; the AR twin served by the same engine with
continuous batching) a server is started on a free 127.0.0.1 port, and for each offered rate
the same seeded Poisson arrival trace of prompts drawn from the task suite's held-out examples is
sent as streaming completions. Per (mode, rate): achieved throughput, TTFT (arrival to the first
streamed text), inter-chunk time, end-to-end latency percentiles, and goodput (requests per
second that meet both latency targets). Then one probe: short requests arriving while long
canvases decode, their TTFT against the long requests' step time.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/serve_load.py --out benchmarks/results/serve

Writes serve_load.json and serve_load.png to --out and prints a table. The timing includes
HTTP, tokenisation, scheduling and every forward: it is what a client sees.

The few-shot workload (`--workload fewshot`) is the prefix cache's: every prompt is one of
`--prefixes` shared prefixes of about `--prefix-tokens` tokens (worked word problems, as a k-shot
GSM8K prompt) followed by its own held-out question; modes name a model kind, a scheduling and
whether the prefix cache is on, e.g. `block`, `block-nocache`, `block-static`, `ar`,
`ar-nocache`. With `--shape 25m` the block model and the AR twin are random-weight checkpoints of
the 25 M shape (8 layers, d 512, 8 heads, ff 1376; the embedded models' tokenizer and layout),
written under --checkpoints, so that the forwards, not HTTP, dominate; their requests decode
`--gen` tokens (a list: each request draws one) past any end of text (`ignore_eos`) so that every
mode does the same work, and each answer is compared across modes (the prefix cache must not
change one token).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/serve_load.py --workload fewshot --shape 25m \
        --modes block,block-nocache,block-static,ar,ar-nocache --rates 1,2,4 --out benchmarks/results/serve_fewshot
"""

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import httpx  # noqa: E402

from unmask.bench.runner import context  # noqa: E402
from unmask.tasks import TASKS, held_out  # noqa: E402


def percentile(values, q):
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q / 100
    lo = int(k)
    return v[lo] + (v[min(lo + 1, len(v) - 1)] - v[lo]) * (k - lo)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, args, scheduling: str, model: str | None = None, replicas: int | None = None,
                 prefix_cache_mb: float | None = None) -> None:
        self.port = free_port()
        cmd = [sys.executable, "-m", "unmask", "serve", "--port", str(self.port), "--device", "cpu",
               "--scheduling", scheduling, "--max-num-seqs", str(args.max_num_seqs), "--max-waiting", "100000"]
        if prefix_cache_mb is not None:
            cmd += ["--prefix-cache-mb", str(prefix_cache_mb)]
        if replicas:  # Ray Serve: each replica reserves one of the machine's CPUs and runs one thread
            cmd += ["--replicas", str(replicas), "--replica-cpus", "1"]
        if model or args.model:
            cmd += ["--model", model or args.model]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 120
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"server did not start: {self.proc.stderr.read() if self.proc.stderr else ''}")
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.send_signal(2)  # Ctrl-C: a Ray Serve server shuts its replicas down gracefully
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


def trace(rate: float, n: int, max_seconds: float, seed: int) -> list[tuple[float, str]]:
    """Poisson arrivals at `rate` per second, at most n or max_seconds, each with a held-out prompt."""
    rng = random.Random(seed)
    pool = [ex.prompt for t in TASKS for ex in held_out(t, 50)]
    out, t = [], 0.0
    while len(out) < n:
        t += rng.expovariate(rate)
        if t > max_seconds:
            break
        out.append((t, rng.choice(pool)))
    return out


def fewshot_prompts(n_prefixes: int, prefix_tokens: int, seed: int) -> tuple[list[str], list[str]]:
    """`n_prefixes` shared prefixes of about `prefix_tokens` words, each a run of worked word
    problems (question and answer) from the selection split, and the held-out questions that
    follow them."""
    from unmask.tasks import split_examples

    rng = random.Random(seed)
    shots = [f"{ex.prompt} {ex.answer}" for ex in split_examples("word", "selection")]
    prefixes = []
    for _ in range(n_prefixes):
        words: list[str] = []
        while len(words) < prefix_tokens:
            words += rng.choice(shots).split()
        prefixes.append(" ".join(words))
    return prefixes, [ex.prompt for ex in split_examples("word", "report", 200)]


def fewshot_trace(rate: float, n: int, max_seconds: float, seed: int, prefixes, questions,
                  gens: list[int]) -> list[tuple[float, str, int]]:
    """Poisson arrivals, each a shared prefix (the first twice as often as each other), a question
    and the tokens it decodes (one of `gens`, uniformly)."""
    rng = random.Random(seed)
    weights = [2.0] + [1.0] * (len(prefixes) - 1)
    out, t = [], 0.0
    while len(out) < n:
        t += rng.expovariate(rate)
        if t > max_seconds:
            break
        out.append((t, f"{rng.choices(prefixes, weights)[0]} {rng.choice(questions)}", rng.choice(gens)))
    return out


def write_random_checkpoint(base: str, folder: Path, seed: int = 0) -> Path:
    """The embedded model `base`'s folder (tokenizer, layout, generation defaults) at the 25 M
    shape with random weights (projections of std 1/sqrt(fan-in), embeddings of std 1, a head
    three times as sharp, so answers vary with their prompts; MASK never proposed): written once."""
    import shutil

    import torch
    from safetensors.torch import save_file

    from unmask.loading import resolve_model_path

    if (folder / "model.safetensors").exists():
        return folder
    src = resolve_model_path(base)
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        shutil.copy(src / name, folder / name)
    cfg = json.loads((src / "config.json").read_text())
    d, layers, ff = 512, 8, 1376
    cfg.update(d_model=d, n_layers=layers, n_heads=8, n_kv_heads=8, mlp_hidden_size=ff, max_sequence_length=4096)
    V = cfg["embedding_size"]
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g) / s[-1] ** 0.5  # noqa: E731
    t = {"model.transformer.wte.weight": torch.randn(V, d, generator=g), "model.transformer.ln_f.weight": torch.ones(d),
         "model.transformer.ff_out.weight": 3 * r(V, d)}
    t["model.transformer.ff_out.weight"][cfg["mask_token_id"]] = -1.0
    for i in range(layers):
        p = f"model.transformer.blocks.{i}."
        t |= {p + "attn_norm.weight": torch.ones(d), p + "ff_norm.weight": torch.ones(d),
              p + "q_proj.weight": r(d, d), p + "k_proj.weight": r(d, d), p + "v_proj.weight": r(d, d),
              p + "attn_out.weight": r(d, d), p + "ff_proj.weight": r(ff, d), p + "up_proj.weight": r(ff, d),
              p + "ff_out.weight": r(d, ff)}
    save_file(t, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


def parse_mode(mode: str) -> dict:
    """A few-shot mode: kind (block, ar), scheduling (continuous unless -static), prefix cache
    (on unless -nocache)."""
    parts = mode.split("-")
    if parts[0] not in ("block", "ar") or any(p not in ("static", "nocache") for p in parts[1:]):
        raise SystemExit(f"few-shot mode {mode!r}: block or ar, then -static and/or -nocache")
    return {"kind": parts[0], "scheduling": "static" if "static" in parts else "continuous",
            "prefix_cache_mb": 0 if "nocache" in parts else None}


async def one(client, url: str, t0: float, at: float, prompt: str, body: dict) -> dict:
    await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
    sent = time.perf_counter()
    chunks, text, status, replica, cached = [], "", None, None, None
    try:
        async with client.stream("POST", url + "/v1/completions", json={"prompt": prompt, "stream": True, **body}) as r:
            status = r.status_code
            replica = r.headers.get("x-unmask-replica")
            if status != 200:
                await r.aread()
            else:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        obj = json.loads(line[6:])
                        if obj.get("usage"):
                            cached = obj["usage"].get("prompt_tokens_details", {}).get("cached_tokens")
                        piece = obj["choices"][0]["text"] if obj.get("choices") else ""
                        if piece:
                            chunks.append(time.perf_counter())
                            text += piece
    except httpx.HTTPError as e:
        status = f"{type(e).__name__}"
    end = time.perf_counter()
    return {"sent": sent - t0, "status": status, "ttft": (chunks[0] - sent) if chunks else None,
            "e2e": end - sent, "gaps": [b - a for a, b in zip(chunks, chunks[1:])], "chars": len(text),
            "replica": replica, "text": text, "cached": cached}


async def run_trace(url: str, arrivals, body: dict) -> tuple[list[dict], float]:
    """Send each arrival (time, prompt, and optionally its own body fields) at its time."""
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(client, url, t0, at, p, {**body, **(own[0] if own else {})})
                                         for at, p, *own in arrivals))
        return results, time.perf_counter() - t0


def summarise(results: list[dict], seconds: float, offered: float, slo_ttft: float, slo_e2e: float) -> dict:
    ok = [r for r in results if r["status"] == 200]
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    e2e = [r["e2e"] for r in ok]
    gaps = [g for r in ok for g in r["gaps"]]
    good = [r for r in ok if r["ttft"] is not None and r["ttft"] <= slo_ttft and r["e2e"] <= slo_e2e]
    pct = lambda v: {f"p{q}": percentile(v, q) for q in (50, 95, 99)}  # noqa: E731
    replicas: dict = {}
    for r in ok:
        if r.get("replica"):
            replicas[r["replica"]] = replicas.get(r["replica"], 0) + 1
    cached = [r["cached"] for r in ok if r.get("cached") is not None]
    return {"offered_rps": offered, "requests": len(results), "completed": len(ok), "per_replica": replicas,
            "cached_tokens_mean": statistics.fmean(cached) if cached else None,
            "requests_reusing": sum(c > 0 for c in cached) if cached else None,
            "errors": len(results) - len(ok), "seconds": seconds, "throughput_rps": len(ok) / seconds,
            "ttft_s": pct(ttft), "e2e_s": pct(e2e), "inter_chunk_s": pct(gaps),
            "goodput_rps": len(good) / seconds, "mean_ttft_s": statistics.fmean(ttft) if ttft else None}


def probe_short_behind_long(url: str, body: dict, long_gen: int, n_long: int) -> dict:
    """n_long long canvases (one token per step) start; 0.5 s later, five short requests arrive one
    at a time. Their TTFT against the time of one engine step while the long ones run."""
    long_body = {**body, "policy": "fixed", "gen_length": long_gen, "block_length": 32, "cache": "dual",
                 "steps": long_gen, "ignore_eos": True}
    long_prompt = held_out("word", 1)[0].prompt

    async def go():
        async with httpx.AsyncClient(timeout=600) as client:
            t0 = time.perf_counter()
            longs = [asyncio.create_task(one(client, url, t0, 0.0, long_prompt, long_body))
                     for _ in range(n_long)]
            await asyncio.sleep(0.5)
            before = httpx.get(url + "/metrics").text
            shorts = []
            for i in range(5):
                shorts.append(await one(client, url, time.perf_counter(), 0.0, held_out("copy", 5)[i].prompt, body))
            after = httpx.get(url + "/metrics").text
            await asyncio.gather(*longs)
            return shorts, before, after

    shorts, before, after = asyncio.run(go())

    def steps(metrics: str):
        get = lambda name: float(next(line.split()[-1] for line in metrics.splitlines() if line.startswith(name)))  # noqa: E731
        return get("unmask_step_seconds_sum"), get("unmask_step_seconds_count")

    (s0, n0), (s1, n1) = steps(before), steps(after)
    step = (s1 - s0) / max(n1 - n0, 1)
    ttft = [r["ttft"] for r in shorts if r["ttft"] is not None]
    return {"long_requests": n_long, "long_gen": long_gen, "mean_step_s_while_long_run": step,
            "short_ttft_s": ttft, "short_ttft_max_over_step": max(ttft) / step if ttft and step else None}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for mode, rows in results.items():
        x = [r["offered_rps"] for r in rows]
        axes[0].plot(x, [r["throughput_rps"] for r in rows], "o-", label=mode)
        axes[1].plot(x, [r["ttft_s"]["p95"] for r in rows], "o-", label=mode)
        axes[2].plot(x, [r["e2e_s"]["p95"] for r in rows], "o-", label=mode)
    for ax, title in zip(axes, ("throughput (requests/s)", "P95 TTFT (s)", "P95 end-to-end (s)")):
        ax.set(xlabel="offered load (requests/s)", title=title)
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    axes[2].set_yscale("log")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_row(mode: str, s: dict) -> None:
    print(f"{mode:14} offered {s['offered_rps']:6.1f}/s  done {s['throughput_rps']:6.1f}/s  "
          f"TTFT p50/p95 {1e3 * (s['ttft_s']['p50'] or 0):7.1f}/{1e3 * (s['ttft_s']['p95'] or 0):7.1f} ms  "
          f"E2E p95 {1e3 * (s['e2e_s']['p95'] or 0):7.1f} ms  goodput {s['goodput_rps']:6.1f}/s  "
          f"errors {s['errors']}" + (f"  per replica {sorted(s['per_replica'].values())}" if s["per_replica"] else "")
          + (f"  reused {s['requests_reusing']}/{s['completed']} ({s['cached_tokens_mean']:.0f} tokens each)"
             if s.get("requests_reusing") is not None else ""), flush=True)


def run_fewshot(a, out: Path) -> None:
    """The few-shot workload (module docstring): each mode's server, a warm-up (each prefix once,
    one at a time, the same for every mode), then each rate's trace; answers compared across modes."""
    if a.shape == "25m":
        root = Path(a.checkpoints)
        models = {"block": str(write_random_checkpoint("default-block", root / "block-25m")),
                  "ar": str(write_random_checkpoint("default-ar", root / "ar-25m"))}
    else:
        models = {"block": "default-block", "ar": "default-ar"}
    prefixes, questions = fewshot_prompts(a.prefixes, a.prefix_tokens, a.seed)
    stream = {"stream_options": {"include_usage": True}, "ignore_eos": True}
    bodies = {"block": {**stream, "policy": "fixed", "block_length": 8}, "ar": stream}
    gens = [int(g) for g in a.gen.split(",")]
    # each request's length: a fixed schedule of two tokens per forward on the block model
    own = {"block": lambda g: {"max_tokens": g, "steps": g // 2}, "ar": lambda g: {"max_tokens": g}}
    rates = [float(r) for r in a.rates.split(",")]
    results, texts = {}, {}
    for mode in a.modes.split(","):
        m = parse_mode(mode)
        server = ServerProcess(a, m["scheduling"], models[m["kind"]], None, m["prefix_cache_mb"])
        try:
            warm = [(0.0, f"{p} {questions[0]}", own[m["kind"]](gens[0])) for p in prefixes]
            for arrival in warm:
                asyncio.run(run_trace(server.url, [arrival], bodies[m["kind"]]))
            results[mode], texts[mode] = [], []
            for i, rate in enumerate(rates):
                arrivals = [(t, p, own[m["kind"]](g)) for t, p, g in
                            fewshot_trace(rate, a.requests, a.max_seconds, a.seed + i, prefixes, questions, gens)]
                rows, seconds = asyncio.run(run_trace(server.url, arrivals, bodies[m["kind"]]))
                s = summarise(rows, seconds, rate, a.slo_ttft, a.slo_e2e)
                results[mode].append(s)
                texts[mode].append([r["text"] if r["status"] == 200 else None for r in rows])
                print_row(mode, s)
        finally:
            server.stop()
    same = {}  # each mode's answers against the same kind's without the prefix cache, rate by rate
    for mode in texts:
        base = mode.replace("-nocache", "").replace("-static", "") + "-nocache"
        if mode != base and base in texts:
            same[mode] = [sum(x is not None and x == y for x, y in zip(ta, tb)) for ta, tb in zip(texts[mode], texts[base])]
            print(f"{mode}: answers equal to {base}'s: {same[mode]} of {[len(t) for t in texts[mode]]}")
    lengths = [len(p.split()) for p in prefixes]
    report = {"context": context(), "setup": vars(a), "bodies": bodies, "prefix_words": lengths,
              "results": results, "answers_equal_to_nocache": same}
    (out / "serve_load.json").write_text(json.dumps(report, indent=2))
    plot(results, out / "serve_load.png")
    print(f"wrote {out / 'serve_load.json'} and serve_load.png")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--rates", default="20,50,100,200,400")
    ap.add_argument("--requests", type=int, default=200, help="arrivals per rate at most")
    ap.add_argument("--max-seconds", type=float, default=20.0, help="arrival window per rate at most")
    ap.add_argument("--modes", default="continuous,static,ar-twin",
                    help="continuous, static (batches drain first), ar-twin (the AR twin, continuous), and ray-1 / "
                         "ray-2 (continuous, behind Ray Serve with 1 or 2 replicas)")
    ap.add_argument("--ar-model", default="default-ar")
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--slo-ttft", type=float, default=0.25)
    ap.add_argument("--slo-e2e", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/serve")
    ap.add_argument("--workload", default="tasks", help="tasks (held-out task prompts) or fewshot (shared prefixes)")
    ap.add_argument("--shape", default="embedded", help="fewshot: embedded (the shipped models) or 25m (random weights)")
    ap.add_argument("--checkpoints", default="/tmp/unmask-serve-25m", help="fewshot --shape 25m: where to write them")
    ap.add_argument("--prefixes", type=int, default=4, help="fewshot: distinct shared prefixes")
    ap.add_argument("--prefix-tokens", type=int, default=1000, help="fewshot: words in each shared prefix")
    ap.add_argument("--gen", default="32", help="fewshot: tokens each request decodes (a list: drawn uniformly)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.workload == "fewshot":
        return run_fewshot(a, out)
    rates = [float(r) for r in a.rates.split(",")]
    body = {"policy": "threshold", "threshold": 0.9, "cache": "dual"}
    results, probe = {}, None
    for mode in a.modes.split(","):
        ar = mode == "ar-twin"
        replicas = int(mode.split("-")[1]) if mode.startswith("ray-") else None
        server = ServerProcess(a, "continuous" if ar or replicas else mode, a.ar_model if ar else None, replicas)
        try:
            results[mode] = []
            for i, rate in enumerate(rates):
                arrivals = trace(rate, a.requests, a.max_seconds, a.seed + i)
                rows, seconds = asyncio.run(run_trace(server.url, arrivals, {} if ar else body))
                s = summarise(rows, seconds, rate, a.slo_ttft, a.slo_e2e)
                results[mode].append(s)
                print_row(mode, s)
            if mode == "continuous":
                probe = probe_short_behind_long(server.url, body, 256, 4)
                print(f"short behind long: TTFT {[round(1e3 * t, 1) for t in probe['short_ttft_s']]} ms, "
                      f"one step {1e3 * probe['mean_step_s_while_long_run']:.1f} ms", flush=True)
        finally:
            server.stop()
    report = {"context": context(), "setup": vars(a), "body": body, "results": results, "short_behind_long": probe}
    (out / "serve_load.json").write_text(json.dumps(report, indent=2))
    plot(results, out / "serve_load.png")
    print(f"wrote {out / 'serve_load.json'} and serve_load.png")


if __name__ == "__main__":
    main()
