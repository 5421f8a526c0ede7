"""What the small open diffusion models cost on this CPU, at their released shapes, beside the
autoregressive models they came from (issue 46, README "Models that run on a laptop").

Random weights of the real configs (config.json values of the releases; written here in their
released layouts, bfloat16 storage as released, loaded as float32 or int8):
  - dllm's Tiny-A2D from Qwen3-0.6B: `a2d-qwen3` MDLM (full attention, unmask's DualCache) and
    BD3LM (blocks of 32, exact cache), and Qwen3-0.6B itself as a causal model (KV cache);
  - dllm's Tiny-A2D from Qwen2.5-Coder-0.5B-Instruct: `a2d-qwen2` MDLM and BD3LM, and the coder
    itself as a causal model (infilling prefix-suffix-middle through its FIM tokens).
Random weights cannot show how many tokens a confident model commits per forward, so the
diffusion models run a fixed schedule of 1, 2 and 4 tokens per forward (`steps` = gen / k); the
AR models one. Per model, dtype, batch (1, 8) and schedule:
  - load: seconds of `LLM(folder)` (reading, converting, kernel choice), resident memory after it
    (`rss_loaded_mb`: after the allocator returned the load's freed scratch; `rss_after_load_mb`: before);
  - answer: a 256-token prompt, 128 generated tokens (blocks of 32);
  - infill: 96 tokens before and 96 after a 32-token hole (full-attention and AR models);
  - ttft_s: the first forward (the prompt and the first commit, all rows joining together);
    s_per_forward: the mean of the others; tokens_per_s: generated tokens of all rows over the
    whole decode (every forward and the decode loop; not tokenisation or load).
Each (model, dtype) runs in a process of its own (load time and memory are its own); the JSON is
rewritten after each and a rerun skips what is there (resumable).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/laptop_models.py   # -> benchmarks/results/laptop_models_cpu.json
"""

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# config.json of the releases (the values that decide the shape)
QWEN3_06B = dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True, rope_theta=1000000.0,
                 rms_norm_eps=1e-6, max_position_embeddings=40960, attention_bias=False, hidden_act="silu",
                 bos_token_id=151643, eos_token_id=151645)
QWEN25_CODER_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                        intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True, rope_theta=1000000.0,
                        rms_norm_eps=1e-6, max_position_embeddings=32768, hidden_act="silu", use_sliding_window=False,
                        bos_token_id=151643, eos_token_id=151645)
# kuleshov-group's OpenWebText releases (bd3lms push_to_hf.py: GPT-2's vocabulary plus the mask)
DIT_OWT = dict(vocab_size=50258, model_length=1024, hidden_dim=768, cond_dim=128, n_blocks=12, n_heads=12,
               dropout=0.1, time_conditioning=False, adaln=True, attn_backend="flex", causal=False)
MDLM_OWT = {**DIT_OWT, "cross_attn": False}
BD3LM_OWT16 = {**DIT_OWT, "cross_attn": True, "block_size": 16, "var_min": True}
# name -> (base shape, config.json's model_type / architecture, kind of run)
MODELS = {
    "Qwen3-0.6B-diffusion-mdlm-v0.1": (QWEN3_06B, "a2d-qwen3", "A2DQwen3LMHeadModel", "full"),
    "Qwen3-0.6B-diffusion-bd3lm-v0.1": (QWEN3_06B, "a2d-qwen3", "A2DQwen3LMHeadModel", "block"),
    "Qwen3-0.6B": (QWEN3_06B, "qwen3", "Qwen3ForCausalLM", "causal"),
    "Qwen2.5-Coder-0.5B-Instruct-diffusion-mdlm-v0.1": (QWEN25_CODER_05B, "a2d-qwen2", "A2DQwen2LMHeadModel", "full"),
    "Qwen2.5-Coder-0.5B-Instruct-diffusion-bd3lm-v0.1": (QWEN25_CODER_05B, "a2d-qwen2", "A2DQwen2LMHeadModel",
                                                         "block"),
    "Qwen2.5-Coder-0.5B-Instruct": (QWEN25_CODER_05B, "qwen2", "Qwen2ForCausalLM", "causal"),
    "mdlm-owt": (MDLM_OWT, "mdlm", "MDLM", "full"),
    "bd3lm-owt-block_size16": (BD3LM_OWT16, "bd3lm", "BD3LM", "block"),
}
README_MODELS = list(MODELS)[:6]  # the README's table: the Tiny-A2D pairs beside their AR parents
ORGS = {"mdlm-owt": "kuleshov-group/", "bd3lm-owt-block_size16": "kuleshov-group/"}
# the Qwen tokenizers' special tokens at their ids (the word-level stand-in's; prompts are ids)
SPECIALS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|fim_prefix|>": 151659,
            "<|fim_middle|>": 151660, "<|fim_suffix|>": 151661, "<|fim_pad|>": 151662, "<|mask|>": 151669}
PROMPT, GEN, HOLE, SIDE = 256, 128, 32, 96


def write_weights(base: dict, path: Path, seed: int = 0) -> None:
    """Random weights of the Qwen layout (bfloat16, as released), tied head."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    d, f, V = base["hidden_size"], base["intermediate_size"], base["vocab_size"]
    hd = base.get("head_dim") or d // base["num_attention_heads"]
    q, kv = base["num_attention_heads"] * hd, base["num_key_value_heads"] * hd

    def w(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    t = {"model.embed_tokens.weight": w(V, d), "model.norm.weight": torch.ones(d, dtype=torch.bfloat16)}
    for i in range(base["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": torch.ones(d, dtype=torch.bfloat16),
                  p + "post_attention_layernorm.weight": torch.ones(d, dtype=torch.bfloat16),
                  p + "self_attn.q_proj.weight": w(q, d), p + "self_attn.k_proj.weight": w(kv, d),
                  p + "self_attn.v_proj.weight": w(kv, d), p + "self_attn.o_proj.weight": w(d, q),
                  p + "mlp.gate_proj.weight": w(f, d), p + "mlp.up_proj.weight": w(f, d),
                  p + "mlp.down_proj.weight": w(d, f)})
        if "head_dim" in base:  # Qwen3: per-head q/k norms
            t[p + "self_attn.q_norm.weight"] = torch.ones(hd, dtype=torch.bfloat16)
            t[p + "self_attn.k_norm.weight"] = torch.ones(hd, dtype=torch.bfloat16)
        else:  # Qwen2: q/k/v biases
            for n, size in (("q", q), ("k", kv), ("v", kv)):
                t[p + f"self_attn.{n}_proj.bias"] = w(size)
    save_file(t, path, metadata={"format": "pt"})


def write_dit_weights(base: dict, path: Path, seed: int = 0) -> None:
    """Random weights of the MDLM / BD3-LM DiT layout (float32, as bd3lms' push_to_hf saves them)."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    d, V, c = base["hidden_dim"], base["vocab_size"], base["cond_dim"]

    def w(*shape):
        return torch.randn(*shape, generator=g) * 0.02

    t = {"backbone.vocab_embed.embedding": w(V, d), "backbone.sigma_map.mlp.0.weight": w(c, 256),
         "backbone.sigma_map.mlp.0.bias": w(c), "backbone.sigma_map.mlp.2.weight": w(c, c),
         "backbone.sigma_map.mlp.2.bias": w(c), "backbone.output_layer.norm_final.weight": torch.ones(d),
         "backbone.output_layer.linear.weight": w(V, d), "backbone.output_layer.linear.bias": w(V),
         "backbone.output_layer.adaLN_modulation.weight": w(2 * d, c),
         "backbone.output_layer.adaLN_modulation.bias": w(2 * d)}
    for i in range(base["n_blocks"]):
        p = f"backbone.blocks.{i}."
        t.update({p + "norm1.weight": torch.ones(d), p + "norm2.weight": torch.ones(d),
                  p + "attn_qkv.weight": w(3 * d, d), p + "attn_out.weight": w(d, d),
                  p + "mlp.0.weight": w(4 * d, d), p + "mlp.0.bias": w(4 * d), p + "mlp.2.weight": w(d, 4 * d),
                  p + "mlp.2.bias": w(d), p + "adaLN_modulation.weight": w(6 * d, c),
                  p + "adaLN_modulation.bias": w(6 * d)})
    save_file(t, path, metadata={"format": "pt"})


def write_folder(root: Path, name: str) -> Path:
    """The release's folder: config.json, the (shared) weights, a word-level tokenizer naming the
    real special tokens at their ids. A BD3LM release's folder carries its name (its block)."""
    base, model_type, arch, _ = MODELS[name]
    folder = root / name
    if (folder / "config.json").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    dit = "hidden_dim" in base
    weights = root / (f"weights-dit-{name}.safetensors" if dit else f"weights-{base['hidden_size']}.safetensors")
    if not weights.exists():
        (write_dit_weights if dit else write_weights)(base, weights)
    (folder / "model.safetensors").symlink_to(weights)
    (folder / "config.json").write_text(json.dumps({**base, "model_type": model_type, "architectures": [arch]}))
    specials = {"<|endoftext|>": 50256} if dit else SPECIALS  # GPT-2's, whose tokenizer the DiT releases use
    vocab = {"<unk>": 0, **{f"w{i}": i for i in range(1, 1000)}, **specials}
    tok = {"version": "1.0", "truncation": None, "padding": None,
           "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for s, i in specials.items()],
           "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
           "decoder": None, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"} if dit else
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "mask_token": "<|mask|>"}))
    return folder


def trimmed_rss_mb() -> float:
    """Resident memory after the C allocator returned what it holds free (glibc's malloc_trim):
    what the loaded model occupies, without the load's freed scratch still counted."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    return rss_mb()


def rss_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def worker(folder: str, quantize: str | None, kind: str, batches: list[int], schedules: list[int],
           block: int = 32) -> dict:
    import torch

    from unmask import LLM

    t0 = time.perf_counter()
    llm = LLM(folder, quantize=quantize)
    out = {"load_s": round(time.perf_counter() - t0, 2), "rss_after_load_mb": round(rss_mb()),
           "rss_loaded_mb": round(trimmed_rss_mb()), "runs": []}
    if not batches:  # --batches none: load time and memory only
        return out
    g = torch.Generator().manual_seed(0)
    ids = lambda n, b: torch.randint(1, 1000, (b, n), generator=g).tolist()  # noqa: E731 (ordinary words)
    # infilling: the full-attention models (text on both sides) and the coder, prefix-suffix-middle
    tasks = ["answer"] + (["infill"] if kind == "full" or kind == "causal" and "Coder" in folder else [])
    warm = set()
    for task in tasks:
        for b in batches:
            for k in ([1] if kind == "causal" else schedules):
                gen = GEN if task == "answer" else HOLE
                given = dict(gen_length=gen, early_stop=False)
                if kind != "causal":
                    given.update(policy="fixed", steps=gen // k, block_length=block,
                                 cache="exact" if kind == "block" else "dual")
                params = llm.default_params(**given)
                if task == "answer":
                    prompts, suffix = ids(PROMPT, b), None
                else:
                    prompts, suffix = ids(SIDE, b), ids(SIDE, b)
                if (task, b) not in warm:  # once per shape: the allocator's first touches, not the kernels' choice
                    llm.generate(prompts, replace(params, steps=None if kind == "causal" else gen // max(schedules)),
                                 suffix=suffix)
                    warm.add((task, b))
                t = time.perf_counter()
                res = llm.generate(prompts, params, suffix=suffix)
                seconds = time.perf_counter() - t
                fw = [s.seconds for s in res.steps]
                tokens = sum(len(r.raw_ids) for r in res.results)
                out["runs"].append({"task": task, "batch": b, "tokens_per_forward": k, "forwards": len(fw),
                                    "ttft_s": round(fw[0], 4),
                                    "s_per_forward": round(sum(fw[1:]) / max(len(fw) - 1, 1), 4),
                                    "seconds": round(seconds, 3), "tokens": tokens,
                                    "tokens_per_s": round(tokens / seconds, 2)})
                print(json.dumps(out["runs"][-1]), file=sys.stderr, flush=True)
    out["peak_rss_mb"] = round(int(next(x for x in open("/proc/self/status") if x.startswith("VmHWM:")).split()[1])
                               / 1024)
    return out


KIND_TEXT = {"full": "masked, full attention", "block": "block diffusion (32)", "causal": "autoregressive"}


def params_b(name: str) -> float:
    """Parameters of the release's shape, in billions (tied embeddings counted once)."""
    from unmask.models.registry import resolve_family

    base, model_type, arch, _ = MODELS[name]
    cfg = {**base, "model_type": model_type, "architectures": [arch]}
    return resolve_family(cfg).arch(cfg).num_parameters() / 1e9


def readme_rows(result: dict) -> list[str]:
    """The README's rows ("Models that run on a laptop"), from the JSON: per model, float32 load
    time and memory, tokens/s at batch 1 (1 / 2 / 4 tokens per forward; 1 for an AR model) and at
    batch 8 (4 per forward; 1 for AR), and the same two at int8."""
    rows = []
    for name in README_MODELS:
        f, q = result["rows"].get(f"{name} float32"), result["rows"].get(f"{name} int8")
        if f is None or q is None:
            continue

        def tps(row, batch, k):
            return next(r["tokens_per_s"] for r in row["runs"] if r["task"] == "answer" and r["batch"] == batch
                        and r["tokens_per_forward"] == k)

        causal = f["kind"] == "causal"
        b1 = f"{tps(f, 1, 1):.1f}" if causal else " / ".join(f"{tps(f, 1, k):.1f}" for k in (1, 2, 4))
        k = 1 if causal else 4
        org = "dllm-hub/" if "diffusion" in name else "Qwen/"
        rows.append(f"| `{org}{name}` | {params_b(name):.2f} B | {KIND_TEXT[f['kind']]} | {f['load_s']:.0f} s, "
                    f"{f['rss_loaded_mb'] / 1024:.1f} GB | {b1} | {tps(f, 8, k):.1f} | "
                    f"{tps(q, 1, k):.1f} / {tps(q, 8, k):.1f} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="/tmp/unmask-laptop-models", help="where the random-weight folders are written")
    ap.add_argument("--out", default="benchmarks/results/laptop_models_cpu.json")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--dtypes", default="float32,int8")
    ap.add_argument("--batches", default="1,8", help="'none': only load each model and measure its memory")
    ap.add_argument("--schedules", default="1,2,4", help="tokens per forward of the diffusion models' fixed schedule")
    ap.add_argument("--block-length", type=int, default=32,
                    help="the denoising window (a block, or a sub-block of a block model's 32); the table's is 32")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    batches = [] if a.batches == "none" else [int(x) for x in a.batches.split(",")]
    schedules = [int(x) for x in a.schedules.split(",")]
    if a.worker:
        folder, quantize, kind = a.worker
        print(json.dumps(worker(folder, None if quantize == "float32" else quantize, kind, batches, schedules,
                                a.block_length)))
        return
    from unmask.bench.runner import context
    from unmask.files import write_json_atomic

    out_path = Path(a.out)
    result = json.loads(out_path.read_text()) if out_path.exists() else {}
    result["context"] = {**context(), "setup": __doc__.split("\n\n")[1:3], "block_length": a.block_length}
    result.setdefault("rows", {})
    root = Path(a.root)
    root.mkdir(parents=True, exist_ok=True)
    for name in a.models.split(","):
        folder = write_folder(root, name)
        for dtype in a.dtypes.split(","):
            key = f"{name} {dtype}"
            if key in result["rows"] and (batches or "rss_loaded_mb" in result["rows"][key]):
                continue
            print(f"== {key}", file=sys.stderr, flush=True)
            run = subprocess.run([sys.executable, __file__, "--worker", str(folder), dtype, MODELS[name][3],
                                  "--batches", a.batches, "--schedules", a.schedules, "--block-length",
                                  str(min(a.block_length, MODELS[name][0].get("block_size") or a.block_length))],
                                 stdout=subprocess.PIPE, text=True)
            if run.returncode:
                raise SystemExit(f"{key}: the worker failed ({run.returncode})")
            got = json.loads(run.stdout.strip().splitlines()[-1])
            if not batches:  # a load-only pass adds the load's figures to what was measured
                result["rows"][key].update(load_s_again=got["load_s"], rss_loaded_mb=got["rss_loaded_mb"])
            else:
                result["rows"][key] = {"model": name, "dtype": dtype, "kind": MODELS[name][3],
                                       "parameters_b": round(params_b(name), 3), **got}
            write_json_atomic(out_path, result)
    print(json.dumps(result["rows"], indent=1))


if __name__ == "__main__":
    main()
