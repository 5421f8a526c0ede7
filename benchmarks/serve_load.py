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
    def __init__(self, args, scheduling: str, model: str | None = None, replicas: int | None = None) -> None:
        self.port = free_port()
        cmd = [sys.executable, "-m", "unmask", "serve", "--port", str(self.port), "--device", "cpu",
               "--scheduling", scheduling, "--max-num-seqs", str(args.max_num_seqs), "--max-waiting", "100000"]
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


async def one(client, url: str, t0: float, at: float, prompt: str, body: dict) -> dict:
    await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
    sent = time.perf_counter()
    chunks, text, status, replica = [], "", None, None
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
                        piece = obj["choices"][0]["text"] if obj.get("choices") else ""
                        if piece:
                            chunks.append(time.perf_counter())
                            text += piece
    except httpx.HTTPError as e:
        status = f"{type(e).__name__}"
    end = time.perf_counter()
    return {"sent": sent - t0, "status": status, "ttft": (chunks[0] - sent) if chunks else None,
            "e2e": end - sent, "gaps": [b - a for a, b in zip(chunks, chunks[1:])], "chars": len(text),
            "replica": replica}


async def run_trace(url: str, arrivals, body: dict) -> tuple[list[dict], float]:
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(client, url, t0, at, p, body) for at, p in arrivals))
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
    return {"offered_rps": offered, "requests": len(results), "completed": len(ok), "per_replica": replicas,
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
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
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
                print(f"{mode:10} offered {rate:6.1f}/s  done {s['throughput_rps']:6.1f}/s  "
                      f"TTFT p50/p95 {1e3 * (s['ttft_s']['p50'] or 0):7.1f}/{1e3 * (s['ttft_s']['p95'] or 0):7.1f} ms  "
                      f"E2E p95 {1e3 * (s['e2e_s']['p95'] or 0):7.1f} ms  goodput {s['goodput_rps']:6.1f}/s  "
                      f"errors {s['errors']}" + (f"  per replica {sorted(s['per_replica'].values())}"
                                                 if s["per_replica"] else ""), flush=True)
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
