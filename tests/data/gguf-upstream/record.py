"""Records GGUF files written by llama.cpp's own converter (convert_hf_to_gguf.py and its gguf-py),
from the tiny LLaDA and Dream checkpoints tests/checkpoints.py writes (byte-level BPE tokenizers,
seed 0), in the storage types the converter writes itself: f32, f16, bf16, q8_0; a tiny LLaDA-MoE
in the layout llama.cpp runs (every layer routed, no shared expert, no expert bias) too; and, from a 256-wide LLaDA (k-quants need rows in multiples of 256), the types
`llama-quantize` writes from its F32 file: Q4_0, Q4_K_M (Q4_K and Q6_K tensors), Q5_K_M (Q5_K and
Q6_K).

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/lcp
    tar xzf /tmp/lcp/llama_cpp_python-0.3.36.tar.gz -C /tmp/lcp
    L=/tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -S $L -B $L/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF
    cmake --build $L/build --target llama-quantize
    cmake --build $L/build --target llama-diffusion-cli
    python tests/data/gguf-upstream/record.py $L [NAME ...]   # NAME: llada, dream, llada-moe, quantized, cli

One line of the converter is replaced: its check of the BPE pre-tokenizer, which recognises a
release's tokenizer by the sha256 of its ids on a fixed text and so refuses any tokenizer it has
not seen; the tiny tokenizers are GPT-2-style byte level, so "gpt-2" is named, as the converter
names it for GPT-2. And for LLaDA-MoE the converter writes the release's mask id (156895, a
constant in its code) whatever the tokenizer holds; the tiny model's own mask id is written over
it. Everything else (settings, q/k permutation, tensor names, vocabulary, special
ids, chat template) is the converter's own code."""

import json
import runpy
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # tests/

from checkpoints import write_dream, write_llada, write_llada_moe  # noqa: E402

MODELS = {"llada": lambda p: write_llada(p, bpe=True, shards=1), "dream": lambda p: write_dream(p, bpe=True, shards=1),
          "llada-moe": lambda p: write_llada_moe(p, bpe=True, shards=1, shared_ff=0, expert_bias=False,
                                                 moe_layer_freq=(1, 1, 1))}
TYPES = ("f32", "f16", "bf16", "q8_0")
WIDE = lambda p: write_llada(p, d=256, layers=1, heads=4, kv_heads=2, ff=256, bpe=True, shards=1)  # noqa: E731
QUANTIZED = ("Q4_0", "Q4_K_M", "Q5_K_M")


def main(llama_cpp: str, only: list[str]) -> None:
    sys.path[:0] = [llama_cpp, f"{llama_cpp}/gguf-py"]
    import conversion.base as base  # noqa: E402  (llama.cpp's converter)
    import conversion.llada as llada  # noqa: E402

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    release = llada.LLaDAMoEModel.set_gguf_parameters

    def own_mask(self):  # the converter's parameters, then the checkpoint's own mask id over its constant
        release(self)
        self.gguf_writer.add_mask_token_id(self.hparams["mask_token_id"])

    llada.LLaDAMoEModel.set_gguf_parameters = own_mask
    with tempfile.TemporaryDirectory() as tmp:
        for name, write in MODELS.items():
            if only and name not in only:
                continue
            src = write(Path(tmp) / name)
            for kind in TYPES:
                sys.argv = ["convert_hf_to_gguf.py", str(src), "--outfile", str(HERE / f"{name}-{kind}.gguf"),
                            "--outtype", kind]
                runpy.run_path(f"{llama_cpp}/convert_hf_to_gguf.py", run_name="__main__")
        if not only or "quantized" in only:
            f32 = Path(tmp) / "llada256-f32.gguf"
            sys.argv = ["convert_hf_to_gguf.py", str(WIDE(Path(tmp) / "llada256")), "--outfile", str(f32), "--outtype", "f32"]
            runpy.run_path(f"{llama_cpp}/convert_hf_to_gguf.py", run_name="__main__")
            for kind in QUANTIZED:
                subprocess.run([f"{llama_cpp}/build/bin/llama-quantize", str(f32), str(HERE / f"llada256-{kind.lower()}.gguf"),
                                kind], check=True, capture_output=True)
    if not only or "cli" in only:
        record_cli(Path(llama_cpp))


# prompts whose chat-templated ids are a whole number of blocks (counted by the benchmark's helper)
CLI_CASES = (("llada-moe-f32.gguf", 16, 8), ("llada-moe-f32.gguf", 24, 8), ("llada-moe-f32.gguf", 32, 16),
             ("llada-f32.gguf", 16, 8), ("llada-f32.gguf", 32, 16))


def record_cli(llama_cpp: Path) -> None:
    sys.path.insert(0, str(HERE.parents[2] / "benchmarks"))
    from vs_llama_cpp import _prompt, cli  # noqa: E402  (the side-by-side benchmark's runner and prompts)

    from unmask import LLM  # noqa: E402

    words = ["the", "cat", "sat", "on", "mat", "def", "return", "user", "x", "1"]
    out = []
    for name, want, block in CLI_CASES:
        prompt, n = _prompt(LLM(HERE / name), words, want, block)
        run = cli(llama_cpp, HERE / name, prompt, n + block, block, (n + block) // block, 1, block)
        out.append({"file": name, "prompt": prompt, "prompt_ids": n, "block": block, "text": run["text"]})
    (HERE / "diffusion-cli.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    try:
        main(sys.argv[1], sys.argv[2:])
    finally:
        shutil.rmtree(HERE / "__pycache__", ignore_errors=True)
