"""Records GGUF files written by llama.cpp's own converter (convert_hf_to_gguf.py and its gguf-py),
from the tiny LLaDA and Dream checkpoints tests/checkpoints.py writes (byte-level BPE tokenizers,
seed 0), in the storage types the converter writes itself: f32, f16, bf16, q8_0; and, from a
256-wide LLaDA (k-quants need rows in multiples of 256), the types `llama-quantize` writes from its
F32 file: Q4_0, Q4_K_M (Q4_K and Q6_K tensors), Q5_K_M (Q5_K and Q6_K).

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/lcp
    tar xzf /tmp/lcp/llama_cpp_python-0.3.36.tar.gz -C /tmp/lcp
    L=/tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -S $L -B $L/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF
    cmake --build $L/build --target llama-quantize
    python tests/data/gguf-upstream/record.py $L

One line of the converter is replaced: its check of the BPE pre-tokenizer, which recognises a
release's tokenizer by the sha256 of its ids on a fixed text and so refuses any tokenizer it has
not seen; the tiny tokenizers are GPT-2-style byte level, so "gpt-2" is named, as the converter
names it for GPT-2. Everything else (settings, q/k permutation, tensor names, vocabulary, special
ids, chat template) is the converter's own code."""

import runpy
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # tests/

from checkpoints import write_dream, write_llada  # noqa: E402

MODELS = {"llada": lambda p: write_llada(p, bpe=True, shards=1), "dream": lambda p: write_dream(p, bpe=True, shards=1)}
TYPES = ("f32", "f16", "bf16", "q8_0")
WIDE = lambda p: write_llada(p, d=256, layers=1, heads=4, kv_heads=2, ff=256, bpe=True, shards=1)  # noqa: E731
QUANTIZED = ("Q4_0", "Q4_K_M", "Q5_K_M")


def main(llama_cpp: str) -> None:
    sys.path[:0] = [llama_cpp, f"{llama_cpp}/gguf-py"]
    import conversion.base as base  # noqa: E402  (llama.cpp's converter)

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    with tempfile.TemporaryDirectory() as tmp:
        for name, write in MODELS.items():
            src = write(Path(tmp) / name)
            for kind in TYPES:
                sys.argv = ["convert_hf_to_gguf.py", str(src), "--outfile", str(HERE / f"{name}-{kind}.gguf"),
                            "--outtype", kind]
                runpy.run_path(f"{llama_cpp}/convert_hf_to_gguf.py", run_name="__main__")
        f32 = Path(tmp) / "llada256-f32.gguf"
        sys.argv = ["convert_hf_to_gguf.py", str(WIDE(Path(tmp) / "llada256")), "--outfile", str(f32), "--outtype", "f32"]
        runpy.run_path(f"{llama_cpp}/convert_hf_to_gguf.py", run_name="__main__")
        for kind in QUANTIZED:
            subprocess.run([f"{llama_cpp}/build/bin/llama-quantize", str(f32), str(HERE / f"llada256-{kind.lower()}.gguf"),
                            kind], check=True, capture_output=True)
    shutil.rmtree(HERE / "__pycache__", ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1])
