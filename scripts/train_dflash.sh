#!/usr/bin/env bash
# The recorded recipe of the embedded DFlash drafter `default-dflash` for the AR twin `default-ar`
# (seed 0, this 2-core CPU; about 70 minutes). SpecForge's DFlash objective (`unmask train --kind
# dflash`, unmask.train.dflash): the target answers every training prompt itself (greedy), and the
# drafter learns to fill blocks [anchor, MASK x 7] from the target's features before the anchor
# (all four target layers), 16 anchors per row, loss decaying exp(-(k - 1) / 4) with the position k
# in the block. Drafter: 2 layers of the target's width (256, 4 heads), MLP 512, blocks of 8.
# Resumable: rerun this script; a finished run is skipped. Then python scripts/ship_default.py --dflash.
set -euo pipefail
export OMP_WAIT_POLICY=PASSIVE
RUNS=${RUNS:-runs}
MIX="copy=1.5,reverse=1.5,sort=1.5,arith=3,pairs=0.25,json=1,word=0.75"
STEPS=${DFLASH_STEPS:-2000}
done_run() { [ -f "$1/model/training.json" ] && grep -q '"final": true' "$1/model/training.json"; }
if ! done_run "$RUNS/dflash"; then
  RESUME=$([ -f "$RUNS/dflash/trainer_state.pt" ] && echo --resume || true)
  unmask train --kind dflash --target "${TARGET:-default-ar}" --out "$RUNS/dflash" --layers 2 --mlp 512 \
      --block-length 8 --anchors 16 --loss-gamma 4 --steps "$STEPS" --lr 1e-3 --warmup 100 --batch 64 \
      --gen-length 24 --seed 0 --tasks "$MIX" --eval-every 500 --eval-n 16 $RESUME
fi
