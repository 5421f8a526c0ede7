import json, sys, torch
sys.path.insert(0, "/tmp/up")  # the folder that holds the reference code as a package `llada21`
from llada21.configuration_llada21_moe import LLaDA2MoeConfig
from llada21.modeling_llada21_moe import LLaDA2MoeModelLM
out = sys.argv[1]
cfg = LLaDA2MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, use_qkv_bias=False, use_bias=False, use_qk_norm=True, rms_norm_eps=1e-6, max_position_embeddings=512,
    rope_theta=600000.0, pad_token_id=61, num_experts=8, num_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2,
    routed_scaling_factor=2.5, moe_intermediate_size=16, first_k_dense_replace=1, partial_rotary_factor=0.5,
    eos_token_id=62, mask_token_id=63, architectures=["LLaDA2MoeModelLM"], attn_implementation="sdpa")
torch.manual_seed(0)
m = LLaDA2MoeModelLM(cfg).eval()
with torch.no_grad():
    for n, p in m.named_parameters():
        if p.dim() >= 2:
            p.normal_(0, 0.35 if ("word_embeddings" in n or "lm_head" in n) else 0.2)
        elif "norm" in n:
            p.uniform_(0.7, 1.3)
    # the mask token is never the argmax (upstream's generate would commit MASK and never finish):
    # its output row is the mean of the others, so its logit is the mean logit
    m.lm_head.weight[63] = torch.cat([m.lm_head.weight[:63], m.lm_head.weight[64:]]).mean(0)
    for n, b in m.named_buffers():
        if n.endswith("expert_bias"):
            b.normal_(0, 0.1)
m.save_pretrained(out, safe_serialization=True)
d = json.load(open(f"{out}/config.json")); d["model_type"] = "llada2_moe"; d.pop("auto_map", None)
json.dump(d, open(f"{out}/config.json", "w"), indent=2)
print(sorted(m.state_dict())[:12], len(m.state_dict()))
