"""Soak: many requests with mixed settings through the request engine, then through `unmask
serve`, watching resident memory and the engine's container sizes. A long-running server's
memory must stay flat.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/soak.py [--engine 5000] [--serve 1000]

Engine: requests are added as the running batch drains (at most 16 running, 64 waiting), each
with a setting drawn from a mix (policies, thresholds drawn at random so that settings keep
changing, caches, seeds, sampling, lengths), and released when finished, as the server does.
Every `--every` requests: RSS (from /proc/self/status) and len() of every engine container.
Serve: the server on 127.0.0.1 in a subprocess, requests from a thread pool of 8 clients,
the server process's RSS read from /proc/PID/status. Writes benchmarks/results/soak.json.
"""

import argparse
import os
import random
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from unmask import LLM  # noqa: E402
from unmask.bench.runner import context  # noqa: E402
from unmask.engine import EngineConfig  # noqa: E402
from unmask.files import write_json_atomic  # noqa: E402
from unmask.tasks import TASKS, split_examples  # noqa: E402


def rss_mib(pid: str = "self") -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def setting(rnd: random.Random) -> dict:
    kind = rnd.choice(["fast", "threshold", "fixed", "entropy", "adaptive", "prefix", "sampled"])
    base = {"gen_length": rnd.choice([8, 16, 24]), "block_length": 8}
    if kind == "fast":
        return {**base, "policy": "threshold", "threshold": 0.9, "cache": "dual"}
    if kind == "threshold":  # a new threshold almost every time: settings keep changing
        return {**base, "policy": "threshold", "threshold": round(rnd.uniform(0.3, 0.99), 3), "cache": "none"}
    if kind == "fixed":
        return {**base, "policy": "fixed", "cache": rnd.choice(["none", "dual"])}
    if kind == "entropy":
        return {**base, "policy": "entropy", "gamma": rnd.choice([0.1, 0.5, 1.0]), "cache": "dllm-cache"}
    if kind == "adaptive":
        return {**base, "policy": "threshold", "threshold": 0.9, "cache": "adaptive"}
    if kind == "prefix":
        return {**base, "policy": "budget", "budget": 2.0, "cache": "prefix"}
    return {**base, "policy": "fixed", "temperature": 0.7, "seed": rnd.randrange(10**6), "cache": "none"}


def containers(engine) -> dict:
    return {"records": len(engine.requests), "waiting": engine.num_waiting, "running": engine.num_running,
            "settings": len(engine.kind.settings), "parts": len(engine.kind.parts), "generators": len(engine.generators),
            "trace": len(engine.trace)}


def drive(llm: LLM, engine, prompts: list[list[int]], n: int, rnd: random.Random, queue: int):
    """Add `n` requests with drawn settings as the queue drains (at most `queue` waiting), step
    the engine and release each finished request, as the server does; yield the number finished
    after every step."""
    added = done = 0
    while done < n:
        while added < n and engine.num_waiting < queue:
            engine.add_request(rnd.choice(prompts), llm.default_params(**setting(rnd)))
            added += 1
        for out in engine.step():
            if out.finished:
                engine.release(out.request.id)
                done += 1
        yield done


def soak_engine(llm: LLM, n: int, every: int, seed: int = 0) -> list[dict]:
    prompts = llm.encode([ex.prompt for t in TASKS for ex in split_examples(t, "selection", 30)], chat=False)
    engine = llm.engine(EngineConfig(max_num_seqs=16, max_waiting=64))
    samples, t0, mark = [], time.perf_counter(), every
    for done in drive(llm, engine, prompts, n, random.Random(seed), 16):
        if done >= mark:
            mark += every
            samples.append({"requests": done, "rss_mib": rss_mib(), "seconds": time.perf_counter() - t0,
                            **containers(engine)})
            print(f"engine {done:6d}: RSS {samples[-1]['rss_mib']:.1f} MiB {containers(engine)}")
    return samples


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def soak_serve(n: int, every: int, seed: int = 0) -> list[dict]:
    import httpx

    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "unmask", "serve", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        rnd = random.Random(seed)
        prompts = [ex.prompt for t in TASKS for ex in split_examples(t, "selection", 30)]
        bodies = []
        for i in range(n):
            s = setting(rnd)
            s["max_tokens"] = s.pop("gen_length")
            bodies.append({"prompt": rnd.choice(prompts), "stream": i % 2 == 0, **s})
        samples, t0 = [], time.perf_counter()

        def one(body):
            with httpx.Client(timeout=60) as c:
                if body["stream"]:
                    with c.stream("POST", url + "/v1/completions", json=body) as r:
                        for _ in r.iter_lines():
                            pass
                        return r.status_code
                return c.post(url + "/v1/completions", json=body).status_code

        with ThreadPoolExecutor(8) as pool:
            for start in range(0, n, every):
                codes = list(pool.map(one, bodies[start : start + every]))
                bad = [c for c in codes if c != 200]
                samples.append({"requests": start + len(codes), "rss_mib": rss_mib(str(proc.pid)),
                                "seconds": time.perf_counter() - t0, "errors": len(bad)})
                print(f"serve {samples[-1]['requests']:6d}: server RSS {samples[-1]['rss_mib']:.1f} MiB, errors {len(bad)}")
        return samples
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", type=int, default=5000)
    ap.add_argument("--serve", type=int, default=1000)
    ap.add_argument("--every", type=int, default=500)
    ap.add_argument("--out", default="benchmarks/results/soak.json")
    a = ap.parse_args()
    llm = LLM()
    engine = soak_engine(llm, a.engine, a.every) if a.engine else []
    serve = soak_serve(a.serve, min(a.every, 100)) if a.serve else []
    result = {"benchmark": "soak", "context": context(), "engine": engine, "serve": serve}
    for name, s in (("engine", engine), ("serve", serve)):
        if len(s) >= 2:
            half = s[len(s) // 2]
            result[f"{name}_rss_growth_mib_second_half"] = s[-1]["rss_mib"] - half["rss_mib"]
            result[f"{name}_rss_kib_per_request_second_half"] = (
                1024 * (s[-1]["rss_mib"] - half["rss_mib"]) / max(s[-1]["requests"] - half["requests"], 1))
    write_json_atomic(Path(a.out), result)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
