"""Does a request's native output depend on the kernel the machine picks, or on the batch it runs in?
(issue 46, docs/real-models.md "Reproducible tokens".)

The embedded diffusion model (fast defaults: threshold 0.9, DualCache) and its AR twin decode the
held-out selection prompts of every task, greedy:
  - on each float32 linear kernel (`default`: PyTorch's; `onednn`; `auto`: this machine's
    per-shape choice) — two machines whose tables differ run, layer by layer, one or the other;
  - each prompt alone (batch 1), and all prompts in batches of 8 of mixed lengths.
Reported: how many answers differ, token for token, between each pair of settings (and the tokens
that differ), with the reference setting (`default` kernel, batch 1) as the base.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/batch_invariance.py   # -> benchmarks/results/batch_invariance_cpu.json
"""

import argparse
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from unmask import LLM  # noqa: E402
from unmask.bench.runner import context  # noqa: E402
from unmask.files import write_json_atomic  # noqa: E402
from unmask.tasks import TASKS, split_examples  # noqa: E402

KERNELS = ("default", "onednn", "auto")


def decode(llm: LLM, prompts: list[str], batch: int) -> list[list[int]]:
    params = llm.default_params()
    out = []
    for i in range(0, len(prompts), batch):
        out += [r.raw_ids for r in llm.generate(prompts[i : i + batch], params, chat=False).results]
    return out


def compare(a: list[list[int]], b: list[list[int]]) -> dict:
    rows = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    tokens = sum(sum(p != q for p, q in zip(a[i], b[i])) + abs(len(a[i]) - len(b[i])) for i in rows)
    return {"answers_differ": len(rows), "of": len(a), "tokens_differ": tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-task", type=int, default=24, help="held-out selection prompts per task")
    ap.add_argument("--out", default="benchmarks/results/batch_invariance_cpu.json")
    a = ap.parse_args()
    prompts = [ex.prompt for t in TASKS for ex in split_examples(t, "selection", a.per_task)]
    result = {"context": context(), "prompts": len(prompts), "models": {}}
    for name in ("default", "default-ar"):
        runs = {}
        for kernel in KERNELS:
            llm = LLM(name, linear_kernel=kernel)
            for batch in (1, 8):
                runs[f"{kernel} b{batch}"] = decode(llm, prompts, batch)
        base = runs["default b1"]
        result["models"][name] = {key: compare(base, out) for key, out in runs.items() if key != "default b1"}
        result["models"][name].update({f"b1 vs b8 ({k})": compare(runs[f"{k} b1"], runs[f"{k} b8"]) for k in KERNELS})
        print(name, result["models"][name])
    write_json_atomic(a.out, result)


if __name__ == "__main__":
    main()
