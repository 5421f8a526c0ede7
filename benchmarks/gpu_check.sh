#!/usr/bin/env bash
# GPU check of unmask's CUDA code paths, for a machine with an NVIDIA GPU and a python3 that has
# torch, safetensors, tokenizers, jinja2, numpy, matplotlib, pytest and hypothesis (no install:
# the package runs from src/). Writes to $OUT (default gpu_out/):
#   eval_{ref,fast}_{float32,bfloat16}.json  held-out accuracy of the embedded model on the GPU,
#       one token per step (ref) and threshold 0.9 + DualCache (fast), 200 examples per task
#   bench.txt, bench/bench-*.json|png          `unmask bench --quick` on the GPU (bf16), roofline beside it
#   quantize_cuda.json, quantize.txt           one DualCache step of the 32-layer LLaDA-8B shape (random
#       weights): bf16 against torchao int8 weight-only and fp8 (issue 25; needs torchao: skipped without it)
#   roofline_8b.txt                             the roofline's predicted step times beside it (H200 preset)
#   pytest.txt                                  the test suite with CUDA visible (CLI commands default to it)
set -u
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=src OMP_WAIT_POLICY=PASSIVE PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
for dt in float32 bfloat16; do
  python3 -m unmask eval --device cuda --dtype $dt --n 200 --batch-size 200 --json > "$OUT/eval_ref_$dt.json"
  python3 -m unmask eval --device cuda --dtype $dt --n 200 --batch-size 200 --policy threshold --cache dual \
    --json > "$OUT/eval_fast_$dt.json"
  echo "eval $dt: rc $?"
done
python3 -m unmask bench --quick --device cuda --dtype bfloat16 --out "$OUT/bench" --quiet > "$OUT/bench.txt" 2>&1
echo "bench: rc $?"; tail -12 "$OUT/bench.txt"
if python3 -c "import torchao" 2>/dev/null; then
  timeout 240 python3 benchmarks/quantize.py --device cuda --shapes 8B-layers --big-layers 32 --repeats 6 \
    --out "$OUT/quantize_cuda.json" > "$OUT/quantize.txt" 2>&1
  echo "quantize: rc $?"; tail -20 "$OUT/quantize.txt"
else
  echo "quantize: torchao is not installed here (pip install torchao): skipped"
fi
python3 -m unmask roofline --model llada-8b --step-table --attention --prompt 256 > "$OUT/roofline_8b.txt" 2>&1
timeout 300 python3 -m pytest -q -p no:cacheprovider tests --ignore=tests/test_humaneval.py \
  --ignore=tests/test_harness.py > "$OUT/pytest.txt" 2>&1
echo "pytest: rc $?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.txt" | tail -25
