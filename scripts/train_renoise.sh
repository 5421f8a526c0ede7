#!/usr/bin/env bash
# The recorded recipe of the embedded renoising model `default-renoise` (seed 1, this 2-core CPU).
# DiffusionGemma's layout at the embedded model's width and depth (hidden 256, 4 layers, 4 heads,
# dense GELU MLP 768 beside 4 experts of 32, top 1; 3.8 M parameters against the masked model's
# 3.4 M), canvas = the 24-token answer, trained with uniform-token corruption and self-conditioning
# (`unmask train --kind renoise`, unmask/train/renoise.py), warm-started from the shipped masked
# model (its embedding, attention and MLP weights where they have a counterpart), on the mixture of
# the masked model's last phase. 3000 steps of 64 examples, lr 1e-3 (cosine to 1e-4, warmup 100):
# the step count is what about 75 minutes of this CPU allow (issue 22: <= about 2 hours).
# Resumable: rerun this script; a finished run is skipped. Then python scripts/ship_default.py --renoise.
set -euo pipefail
export OMP_WAIT_POLICY=PASSIVE
RUNS=${RUNS:-runs}
MIX="copy=2,reverse=5,sort=1.5,arith=1,pairs=0.25,json=0.5,word=0.5"
done_run() { [ -f "$1/model/training.json" ] && grep -q '"final": true' "$1/model/training.json"; }
if ! done_run "$RUNS/renoise"; then
  RESUME=$([ -f "$RUNS/renoise/trainer_state.pt" ] && echo --resume || true)
  unmask train --kind renoise --out "$RUNS/renoise" --init-from "${INIT:-default}" --layers 4 --d-model 256 \
      --heads 4 --mlp 768 --gen-length 24 --batch 64 --lr 1e-3 --warmup 100 --steps 3000 --eval-every 500 \
      --eval-n 32 --seed 1 --experts 4 --top-k 1 --expert-size 32 --tasks "$MIX" $RESUME
fi
