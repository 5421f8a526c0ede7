"""Compare unmask's LLaDA2 forward with the reference modeling code's on the checkpoint here (block-causal mask, 2 rows of 64 random ids); measured max |difference| 1.9e-6 with logits up to 6.9."""
import sys, torch
sys.path.insert(0, "/tmp/up")  # the folder that holds the reference code as a package `llada21`
from llada21.modeling_llada21_moe import LLaDA2MoeModelLM
from unmask.models.loader import load_model
up = LLaDA2MoeModelLM.from_pretrained(sys.argv[1] if len(sys.argv) > 1 else ".", attn_implementation="sdpa").eval()
ours, _ = load_model(sys.argv[1] if len(sys.argv) > 1 else ".")
print(ours.config)
torch.manual_seed(1)
L, bl = 64, 32
ids = torch.randint(0, 62, (2, L))
nb = L // bl
bm = torch.tril(torch.ones(nb, nb)).repeat_interleave(bl, 0).repeat_interleave(bl, 1)[None, None].log()
pos = torch.arange(L)[None].expand(2, -1)
with torch.no_grad():
    a = up(ids, attention_mask=bm, position_ids=pos).logits
    b = ours(ids, pos)
print("max diff", (a - b).abs().max().item(), a.abs().max().item())
