#!/usr/bin/env bash
# The recorded recipe of the embedded default model and its AR twin (seed 0, this 2-core CPU).
#   1. the causal AR twin, trained from scratch (it learns the tasks several times faster);
#   2. the masked-diffusion model, initialised from the AR twin's weights (same LLaDA layout,
#      bidirectional attention, no logit shift) and trained with the LLaDA SFT objective.
# Each phase is resumable: rerun a phase with `--resume` (and a larger --steps to go further).
# Then: python scripts/ship_default.py copies runs/*/model into src/unmask/assets/.
set -euo pipefail
export OMP_WAIT_POLICY=PASSIVE
MIX="copy=2,reverse=2,sort=1.5,arith=2,pairs=0.5,json,word"
AR_STEPS=${AR_STEPS:-1200}
DIFF_STEPS=${DIFF_STEPS:-3600}
unmask train --kind ar --out runs/ar --steps "$AR_STEPS" --gen-length 24 --seed 0 --tasks "$MIX" --eval-every 400 --eval-n 32
unmask train --out runs/default --init-from runs/ar --steps "$DIFF_STEPS" --warmup 50 --gen-length 24 --seed 0 \
    --tasks "$MIX" --eval-every 600 --eval-n 32
