"""Check that the recorded training phases reproduce: rerun the first K steps of each phase with
the configuration stored in its run folder and compare the logged losses with the original run's.

    python scripts/check_reproduction.py [--steps 100] [runs/ar runs/default runs/reverse]

Each phase starts from the weights its configuration names (`init_from`), so the check of phase 2
uses the finished phase 1 on disk, as the recipe does. The learning-rate schedule spans the full
`steps` of the phase (`until` stops early). A match of the smoothed loss every 50 steps (5
decimals) says the rerun follows the same trajectory: same data, same masks, same updates; a rerun
of a whole phase (`--steps` at least its length) is also compared weight for weight. It also
reports seconds per step of both runs. Exit status 1 on any mismatch.
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from unmask.train.run import train  # noqa: E402
from unmask.train.trainer import TrainConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def same_tensors(a: Path, b: Path) -> bool:
    x, y = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return x.keys() == y.keys() and all(torch.equal(x[n], y[n]) for n in x)


def check(run: Path, k: int) -> dict:
    meta = json.loads((run / "model" / "training.json").read_text())
    cfg = TrainConfig(**meta["config"])
    original = {h["step"]: h for h in meta["history"] if h["step"] <= k}
    with tempfile.TemporaryDirectory() as tmp:
        train(cfg, Path(tmp) / "run", progress=False, until=k)
        rerun = json.loads((Path(tmp) / "run" / "model" / "training.json").read_text())["history"]
        # a rerun of the whole phase is compared weight for weight as well
        same_weights = same_tensors(Path(tmp) / "run" / "model", run / "model") if k >= cfg.steps else None
    rerun = {h["step"]: h for h in rerun}
    pairs = [(s, original[s]["loss"], rerun[s]["loss"]) for s in sorted(original) if s in rerun]
    last = max(original) if original else None
    return {"run": run.name, "steps": k, "compared_steps": [p[0] for p in pairs],
            "original_loss": [p[1] for p in pairs], "rerun_loss": [p[2] for p in pairs],
            "match": bool(pairs) and all(a == b for _, a, b in pairs) and same_weights is not False,
            "identical_final_weights": same_weights,
            "seconds_per_step": {"original": round(original[last]["seconds"] / last, 3) if last else None,
                                 "rerun": round(rerun[last]["seconds"] / last, 3) if last in rerun else None}}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="*", default=["runs/ar", "runs/default", "runs/reverse"])
    ap.add_argument("--steps", type=int, default=100, help="steps to rerun per phase (a multiple of 50)")
    a = ap.parse_args()
    os.chdir(ROOT)  # run configurations name their parents relative to the repository
    results = [check(Path(r), a.steps) for r in a.runs]
    for r in results:
        print(json.dumps(r))
    return 0 if all(r["match"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
