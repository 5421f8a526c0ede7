"""Where a block-diffusion model errs: the position, inside its block, of each answer's first
wrong token (one token per step, exact cache, first n held-out examples per task).

    python scripts/block_errors.py [--model default-block] [--n 200]

With token shift, a block's first token is scored by the last position of the block before,
which cannot see the block it proposes for: an autoregressive prediction. If errors gather at
offset 0, the AR step is the weak link.
"""

import argparse
import json
from collections import Counter

from unmask import LLM, GenerationParams
from unmask.tasks import TASKS, held_out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default-block")
    ap.add_argument("--n", type=int, default=200)
    a = ap.parse_args()
    llm = LLM(a.model)
    B = llm.arch.block_size
    g = llm.generation_defaults.get("gen_length", 24)
    params = GenerationParams(gen_length=g, block_length=B, steps=g, cache="exact")
    table = {}
    for task in TASKS:
        if task == "pairs":  # scored by validity, not token by token
            continue
        exs = held_out(task, a.n)
        ids = llm.encode([e.prompt for e in exs], chat=False, unknown_words="ignore")
        out = llm.generate(ids, params)
        offsets = Counter()
        for e, p, r in zip(exs, ids, out.results):
            want, got = e.answer.split(), r.text.split()  # word-level vocabulary: a word is a token
            wrong = next((j for j, (x, y) in enumerate(zip(got + [None] * len(want), want)) if x != y), None)
            if wrong is None and got != want:  # right words, then no end of text where it belongs
                wrong = len(want)
            if wrong is not None:
                offsets[(len(p) + wrong) % B] += 1
        errors = sum(offsets.values())
        table[task] = {"errors": errors, "at_block_start": offsets[0],
                       "share_at_block_start": offsets[0] / errors if errors else None,
                       "by_offset": [offsets[k] for k in range(B)]}
        share = f"{100 * offsets[0] / errors:.0f} %" if errors else "-"
        print(f"{task:8} wrong answers {errors:4d}   first error at a block's first position: {offsets[0]:4d} ({share}; "
              f"1/{B} of positions)   by offset {[offsets[k] for k in range(B)]}")
    print(json.dumps({"model": str(llm.path), "block": B, "n": a.n, "tasks": table}))


if __name__ == "__main__":
    main()
