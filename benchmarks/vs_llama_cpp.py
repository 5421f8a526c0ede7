"""unmask beside llama.cpp's `llama-diffusion-cli` on one checkpoint, in one run (issue 49).

llama.cpp is built from the llama-cpp-python sdist (its vendored llama.cpp: `llama-diffusion-cli`,
`llama-quantize`; cmake and a compiler), one random LLaDA in the released layout (byte-level BPE,
tests/checkpoints.py) is converted by llama.cpp's own `convert_hf_to_gguf.py` to F32 and quantized
by `llama-quantize` to Q8_0, Q4_0 and Q4_K_M, and both tools run from those files on the same
prompt (the file's chat template applied by each; the prompt ids are the same, checked through the
decoded text of the same-algorithm decode):

- per forward: one forward over the whole canvas (prompt + gen tokens, logits at every position),
  llama.cpp's from two runs of different step counts (the difference of its reported totals over
  the difference of forwards, so its first step's set-up cancels; a step's sampling, which it
  reports as ~0.03 ms, included), unmask's the median of the model's forward; F32 / float32,
  Q8_0 / int8, Q4_0 / int4 (the Q4_0 tensors kept as stored), Q4_K_M / int4 (its Q4_K / Q6_K tensors rounded
  again to int4);
- tokens (at the first prompt length): one block of 32 after the prompt from one forward, every
  position committed at once by its argmax (`--top-k 1`: llama.cpp's greedy sampler, under which
  its confidence is 1 everywhere and its order left to right; committing the block at once makes
  the order irrelevant), against unmask's compat "llada" with one step; the texts compared;
- whole decode: one token per forward on both (llama.cpp's block schedule with steps = canvas;
  unmask's compat "llada" with steps = gen), and unmask's defaults (DualCache, threshold: on
  random weights there is no quality to hold equal, so only their time and forwards are given);
- start-up: a one-shot generate of 8 tokens, wall time and peak resident memory of the process
  (/usr/bin/time), each tool's own command line.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/vs_llama_cpp.py \
        --llama-cpp /tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp
    # -> benchmarks/results/vs_llama_cpp_cpu.json
"""

import argparse
import difflib
import json
import math
import os
import re
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from unmask import LLM  # noqa: E402
from unmask.bench.runner import context  # noqa: E402
from unmask.files import write_json_atomic  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from checkpoints import write_llada  # noqa: E402

SDIST = "llama-cpp-python==0.3.36"
TOOLS = ("llama-diffusion-cli", "llama-quantize")
QUANTS = ("Q8_0", "Q4_0", "Q4_K_M")


def llama_cpp(where: str | None, scratch: Path) -> Path:
    """The vendored llama.cpp of the llama-cpp-python sdist, its tools built (downloaded first if
    `where` is not given)."""
    if where is None:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", SDIST, "-d",
                        str(scratch)], check=True)
        tar = next(scratch.glob("llama_cpp_python-*.tar.gz"))
        subprocess.run(["tar", "xzf", str(tar), "-C", str(scratch)], check=True)
        where = str(next(scratch.glob("llama_cpp_python-*/vendor/llama.cpp")))
    src = Path(where)
    if not all((src / "build" / "bin" / t).exists() for t in TOOLS):
        subprocess.run(["cmake", "-S", str(src), "-B", str(src / "build"), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                        "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_TESTS=OFF",
                        "-DLLAMA_BUILD_SERVER=OFF"], check=True)
        subprocess.run(["cmake", "--build", str(src / "build"), "-j", str(os.cpu_count()), "--target", *TOOLS],
                       check=True)
    return src


def convert(src: Path, folder: Path, out: Path) -> None:
    """llama.cpp's converter, its BPE pre-tokenizer check told "gpt-2" (tests/data/gguf-upstream/record.py)."""
    sys.path[:0] = [str(src), str(src / "gguf-py")]
    import conversion.base as base

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", str(folder), "--outfile", str(out), "--outtype", "f32"]
    try:
        runpy.run_path(str(src / "convert_hf_to_gguf.py"), run_name="__main__")
    finally:
        sys.argv = argv


def cli(src: Path, model: Path, prompt: str, canvas: int, block: int, steps: int, threads: int, gen: int) -> dict:
    """One llama-diffusion-cli run: its total time (ms, as it reports it), how many forwards its
    schedule ran, and the text it printed."""
    cmd = [str(src / "build" / "bin" / "llama-diffusion-cli"), "-m", str(model), "-p", prompt, "-ub", str(canvas),
           "-c", str(canvas), "-b", str(canvas), "--diffusion-block-length", str(block), "--diffusion-steps",
           str(steps), "-t", str(threads), "-tb", str(threads), "--temp", "0", "--top-k", "1", "--seed", "0"]
    for _ in range(5):  # its log is written by a thread that an exiting process sometimes cuts short
        out = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=1800)
        if out.returncode:
            raise RuntimeError(f"llama-diffusion-cli failed: {out.stderr[-2000:]}")
        log = out.stdout + out.stderr
        found = re.search(r"total time: ([\d.]+)ms", log)
        text = ""
        if found is not None:
            text = log.rsplit("sampling time per step", 1)[1].split("\n", 2)[-1]
            text = re.sub(r"^\d+\.\d+\.\d+\.\d+ I ", "", text, flags=re.M).strip("\n")
            if text:
                break
    if found is None:
        raise RuntimeError(f"llama-diffusion-cli printed no timing ({' '.join(cmd[3:])}): {log[-1500:]}")
    # its schedule: canvas / block blocks from the prompt's end, steps / blocks steps each; a block
    # past the canvas's end runs one forward and stops (nothing masked), a block of the answer all
    # of its steps
    blocks, spb = canvas // block, steps // (canvas // block)
    real = gen // block
    return {"total_ms": float(found.group(1)), "text": text, "forwards": real * spb + (blocks - real)}


def cli_forward_ms(src: Path, model: Path, prompt: str, canvas: int, block: int, threads: int, extra: int,
                   gen: int) -> float:
    """llama.cpp's time per forward: the difference of two runs' totals over the difference of
    their forwards (its first step's graph set-up cancels), the faster of two pairs."""
    blocks = canvas // block
    spb = 1 + max(1, -(-extra // (gen // block)))  # steps per block giving `extra` more forwards at least
    few, many = blocks, spb * blocks
    best = []
    for _ in range(2):
        a, b = (cli(src, model, prompt, canvas, block, s, threads, gen) for s in (few, many))
        best.append((b["total_ms"] - a["total_ms"]) / (b["forwards"] - a["forwards"]))
    return min(best)


def forward_ms(llm: LLM, canvas: int, repeats: int) -> float:
    ids = torch.randint(0, llm.arch.vocab_size, (1, canvas), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(canvas)[None]
    times = []
    with torch.no_grad():
        for i in range(repeats + 2):
            t = time.perf_counter()
            llm.model(ids, pos)
            if i >= 2:
                times.append(1e3 * (time.perf_counter() - t))
    return statistics.median(times)


def startup(cmd: list[str]) -> dict:
    out = subprocess.run(["/usr/bin/time", "-f", "TIME %e %M", *cmd], capture_output=True, text=True, errors="replace",
                         timeout=600)
    wall, rss = re.search(r"TIME ([\d.]+) (\d+)", out.stderr).groups()
    return {"wall_s": float(wall), "peak_rss_mib": round(int(rss) / 1024, 1), "returncode": out.returncode}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-cpp", default=None, help="the sdist's vendor/llama.cpp (built if its tools are missing)")
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--ff", type=int, default=3072)
    ap.add_argument("--prompts", default="64,512", help="prompt lengths (tokens, chat template included)")
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--steps", type=int, default=16, help="llama.cpp forwards told apart per forward measurement")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/vs_llama_cpp_cpu.json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    scratch = Path(tempfile.mkdtemp(prefix="vs_llama_cpp_"))
    src = llama_cpp(a.llama_cpp, scratch)
    folder = write_llada(scratch / "llada", d=a.width, layers=a.layers, heads=a.heads, kv_heads=a.heads, ff=a.ff,
                         bpe=True, shards=1, max_len=4096)
    files = {"F32": scratch / "llada-F32.gguf"}
    convert(src, folder, files["F32"])
    for q in QUANTS:
        files[q] = scratch / f"llada-{q}.gguf"
        subprocess.run([str(src / "build" / "bin" / "llama-quantize"), str(files["F32"]), str(files[q]), q],
                       check=True, capture_output=True)
    ours = {"F32": (files["F32"], None), "Q8_0": (files["F32"], "int8"), "Q4_0": (files["Q4_0"], "int4"),
            "Q4_K_M": (files["Q4_K_M"], "int4")}
    llm = LLM(files["F32"])
    params = _parameters(folder)
    res = {"benchmark": "vs_llama_cpp", "context": context(), "llama_cpp": {"source": SDIST},
           "model": {"family": "llada", "parameters": params, "width": a.width, "layers": a.layers, "ff": a.ff,
                     "vocab": llm.arch.vocab_size, "weights": "random (seed 0)"},
           "threads": a.threads, "gen": a.gen, "block": a.block, "files_mib": {k: round(v.stat().st_size / 2**20, 1)
                                                                               for k, v in files.items()},
           "per_forward": [], "decode": [], "startup": {}}
    words = "the cat sat on the mat and the dog ran to the park ".split()
    lengths = [int(x) for x in a.prompts.split(",")]
    first = lengths[0]
    for want in lengths:
        # llama.cpp's block schedule needs the canvas in whole blocks, LLaDA's the generation
        prompt, n = _prompt(llm, words, want, a.block)
        gen = a.gen + (-a.gen) % a.block
        canvas = n + gen
        for kind, (path, quant) in ours.items():
            them = cli_forward_ms(src, files[kind], prompt, canvas, a.block, a.threads, a.steps, gen)
            mine = LLM(path, quantize=quant)
            us = forward_ms(mine, canvas, a.repeats)
            res["per_forward"].append({"prompt": n, "canvas": canvas, "llama_cpp": kind, "unmask": quant or "float32",
                                       "llama_cpp_ms": round(them, 2), "unmask_ms": round(us, 2),
                                       "ratio": round(us / them, 3)})
            print(f"prompt {n:4d} canvas {canvas:4d} {kind:7} llama.cpp {them:8.2f} ms  unmask "
                  f"{quant or 'float32':7} {us:8.2f} ms  x{us / them:.2f}", flush=True)
            del mine
        if want != first:
            continue
        # tokens: one block after the prompt decoded by one forward, every position committed at
        # once by its argmax (the one schedule where llama.cpp's greedy order, left to right, and
        # LLaDA's low-confidence order commit the same; one block, so a flip cannot carry on)
        theirs = cli(src, files["F32"], prompt, n + a.block, a.block, (n + a.block) // a.block, a.threads, a.block)
        o = llm.generate([prompt], llm.default_params(compat="llada", gen_length=a.block, block_length=a.block,
                                                       steps=1))
        raw = llm.tokenizer.decode(o.results[0].raw_ids, skip_special_tokens=False)
        # whole decode, one token per forward on both: llama.cpp's block schedule (steps = canvas),
        # unmask's compat llada; then unmask's defaults
        whole = cli(src, files["F32"], prompt, canvas, a.block, canvas, a.threads, gen)
        same = llm.default_params(compat="llada", gen_length=gen, block_length=a.block, steps=gen)
        t = time.perf_counter()
        s1 = llm.generate([prompt], same)
        t_same = time.perf_counter() - t
        t = time.perf_counter()
        f = llm.generate([prompt], llm.default_params(gen_length=gen))
        t_fast = time.perf_counter() - t
        row = {"prompt": n, "gen": gen,
               "tokens_one_forward": {"same_text": raw.strip() == theirs["text"].strip(),
                                                "similarity": round(difflib.SequenceMatcher(
                                                    None, raw.strip(), theirs["text"].strip()).ratio(), 3),
                                                "llama_cpp": theirs["text"][:200], "unmask": raw[:200]},
               "llama_cpp_ms": whole["total_ms"], "llama_cpp_forwards": whole["forwards"],
               "unmask_same_schedule_ms": round(1e3 * t_same, 1), "unmask_same_schedule_forwards": s1.nfe,
               "unmask_default_ms": round(1e3 * t_fast, 1), "unmask_default_forwards": f.nfe}
        res["decode"].append(row)
        print(json.dumps(row), flush=True)
    short = _prompt(llm, words, 16, 32)[0]  # a canvas of 64: 32 prompt tokens, 32 generated
    res["startup"] = {
        "llama_cpp": startup([str(src / "build" / "bin" / "llama-diffusion-cli"), "-m", str(files["F32"]), "-p", short,
                              "-ub", "64", "--diffusion-block-length", "32", "--diffusion-steps", "8", "-t",
                              str(a.threads), "--temp", "0", "--top-k", "1"]),
        "unmask": startup([sys.executable, "-m", "unmask", "generate", "--model", str(files["F32"]), "--gen-length",
                           "8", short]),
        "weights_mib": res["files_mib"]["F32"]}
    print(json.dumps(res["startup"]), flush=True)
    write_json_atomic(Path(a.out), res)
    print(f"wrote {a.out}")


def _prompt(llm: LLM, words: list[str], want: int, multiple: int = 1) -> tuple[str, int]:
    """A prompt whose chat-templated ids number at least `want`, a multiple of `multiple`; (text, ids)."""
    text, n = "", 0
    i = 0
    while n < want:
        text += words[i % len(words)] + " "
        i += 1
        n = len(llm.encode(text.strip())[0])
    pieces = list("abcdefghijklmnopqrstuvwxyz") + words
    while n % multiple:  # then pieces that add one token each
        for p in pieces:
            if len(llm.encode(f"{text}{p}".strip())[0]) == n + 1:
                text, n = f"{text}{p} ", n + 1
                break
        else:
            raise RuntimeError(f"no piece adds one token to a prompt of {n}")
    return text.strip(), n


def _parameters(folder: Path) -> int:
    from safetensors import safe_open

    total = 0
    for f in folder.glob("*.safetensors"):
        with safe_open(str(f), "pt") as sf:
            total += sum(math.prod(sf.get_slice(k).get_shape()) for k in sf.keys())
    return total


if __name__ == "__main__":
    main()
