"""Run LLaDA2.1's own generate (its modeling code, mask dtype patched) on a tiny checkpoint; record outputs."""
import json, sys, torch
sys.path.insert(0, "/tmp/up")  # the folder that holds the reference code as a package `llada21`
from llada21.modeling_llada21_moe import LLaDA2MoeModelLM
m = LLaDA2MoeModelLM.from_pretrained(sys.argv[1], attn_implementation="sdpa").eval()
count = [0]
orig = m.forward
def fwd(*a, **k):
    count[0] += 1
    return orig(*a, **k)
m.forward = fwd
g = torch.Generator().manual_seed(5)
prompts = [torch.randint(0, 61, (n,), generator=g).tolist() for n in (3, 5, 8, 11, 16, 17)]
settings = []
for thr in (0.9, 0.5, 0.2):
    for et in (None, 0.9, 0.5, 0.3):
        for mp, bl, G, es in ((16, 8, 24, True), (0, 8, 20, False), (2, 4, 13, True), (16, 16, 32, False)):
            settings.append(dict(threshold=thr, editing_threshold=et, max_post_steps=mp, block_length=bl, gen_length=G, eos_early_stop=es))
cases = []
for s in settings:
    rows = []
    for p in prompts:
        count[0] = 0
        kw = dict(s); et = kw.pop("editing_threshold")
        out = m.generate(inputs=torch.tensor([p]), temperature=0.0, steps=kw["block_length"], eos_id=62, mask_id=63,
                         editing_threshold=1.0 if et is None else et, **kw)
        rows.append({"prompt": p, "output": out[0].tolist(), "nfe": count[0]})
    cases.append({"settings": s, "rows": rows})
json.dump({"source": "LLaDA2.1 modeling_llada2_moe.py generate (dllm copy), transformers 4.57.6, float32 CPU; "
           "the only change: the additive block mask in the model dtype, not bfloat16", "cases": cases},
          open(sys.argv[2], "w"), indent=1)
print(len(cases), sum(len(c["rows"]) for c in cases))
