#!/usr/bin/env bash
# The recorded recipe of the embedded block-diffusion model `default-block` (seed 0, this 2-core CPU).
# Block diffusion (BD3-LM / Fast-dLLM v2 objective, `unmask train --kind block`), blocks of 8
# positions, token shift (logit_shift 1), initialised from the AR twin's weights (as Fast-dLLM v2
# adapts Qwen2.5), at the diffusion phase's fine-tuning learning rate (5e-4: at 2e-3 the change of
# objective wiped out what the twin knew; docs/embedded-model.md).
# Resumable: rerun this script; a finished run is skipped. Then python scripts/ship_default.py --block.
set -euo pipefail
export OMP_WAIT_POLICY=PASSIVE
RUNS=${RUNS:-runs}
MIX_BLOCK="copy=2.5,reverse=2.5,sort=1.5,arith=2,pairs=0.25,json=1,word=0.5"
BLOCK_STEPS=${BLOCK_STEPS:-4500}
done_run() { [ -f "$1/model/training.json" ] && grep -q '"final": true' "$1/model/training.json"; }
if ! done_run "$RUNS/block"; then
  RESUME=$([ -f "$RUNS/block/trainer_state.pt" ] && echo --resume || true)
  unmask train --kind block --block-length 8 --out "$RUNS/block" --init-from "${AR_RUN:-default-ar}" \
      --steps "$BLOCK_STEPS" --lr 5e-4 --warmup 50 --gen-length 24 --seed 0 --tasks "$MIX_BLOCK" \
      --eval-every 500 --eval-n 32 $RESUME
fi
