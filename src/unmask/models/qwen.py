"""The Qwen-layout decoder that several families run: Dream (Qwen2 layout, bidirectionally:
unmask.models.dream), the block-diffusion families Fast-dLLM v2 and SDAR (unmask.models.blockdiff)
and Qwen3 as an autoregressive target, and, with its own layers, LLaDA-MoE. Parameter names equal
the released checkpoint keys: model.{embed_tokens, layers.{i}.{input_layernorm,
self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}, norm}, lm_head;
q/k/v biases and Qwen3's self_attn.{q,k}_norm where the config says so. What differs between the
families (attention pattern, logit shift) is in their ArchConfig, not here.
"""

from torch import nn

from unmask.layers.blocks import self_attention, swiglu
from unmask.layers.norm import RMSNorm
from unmask.layers.rope import RotaryEmbedding
from unmask.models.base import ArchConfig, DiffusionLM


class QwenAttention(nn.Module):
    """self_attn.{q,k,v,o}_proj (q/k/v biases per config, an o_proj bias where the family has one),
    and per-head q_norm / k_norm where the config says so (Qwen3, SDAR, LLaDA-MoE)."""

    def __init__(self, c: ArchConfig) -> None:
        super().__init__()
        d, hd = c.hidden_size, c.head_dim
        self.q_proj = nn.Linear(d, c.num_heads * hd, bias=c.qkv_bias)
        self.k_proj = nn.Linear(d, c.num_kv_heads * hd, bias=c.qkv_bias)
        self.v_proj = nn.Linear(d, c.num_kv_heads * hd, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.num_heads * hd, d, bias=c.attn_out_bias)
        if c.qk_norm:
            self.q_norm = RMSNorm(hd, c.norm_eps)
            self.k_norm = RMSNorm(hd, c.norm_eps)

    def forward(self, h, heads, rope, kv, layer, kv_start, mask):
        return self_attention(h, self.q_proj, self.k_proj, self.v_proj, self.o_proj, *heads, rope, kv, layer, kv_start,
                              mask, getattr(self, "q_norm", None), getattr(self, "k_norm", None))


class GatedMLP(nn.Module):
    """{gate,up,down}_proj: a SwiGLU feed-forward of intermediate size f (also LLaDA2.x's dense and
    shared-expert blocks)."""

    def __init__(self, d: int, f: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return swiglu(x, self.gate_proj, self.up_proj, self.down_proj)


class QwenLayer(nn.Module):
    def __init__(self, c: ArchConfig, index: int = 0) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.norm_eps)
        self.self_attn = QwenAttention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.norm_eps)
        self.mlp = GatedMLP(c.hidden_size, c.intermediate_size)
        self.heads = (c.num_heads, c.num_kv_heads)

    def forward(self, x, rope, kv, layer, kv_start, key_mask):
        x = x + self.self_attn(self.input_layernorm(x), self.heads, rope, kv, layer, kv_start, key_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class _Backbone(nn.Module):
    def __init__(self, c: ArchConfig, layer: type[nn.Module]) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(layer(c, i) for i in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.norm_eps)


class QwenModel(DiffusionLM):
    """The Qwen-layout decoder: model.{embed_tokens, layers, norm}, lm_head. It runs Dream
    (bidirectionally), Fast-dLLM v2 and SDAR (block-causal), Qwen3 (causal: a DFlash target); a
    family with other layers in the same layout (LLaDA-MoE) sets `layer`."""

    layer: type[nn.Module] = QwenLayer
    # the Qwen layout, with LLaDA-MoE's experts and shared expert where a layer has them
    tp_plan = {
        r"model\.layers\.\d+\.self_attn\.q_proj": "col",
        r"model\.layers\.\d+\.self_attn\.(k_proj|v_proj)": "kv",
        r"model\.layers\.\d+\.self_attn\.o_proj": "row",
        r"model\.layers\.\d+\.(mlp|shared_expert)\.(gate_proj|up_proj)": "col",
        r"model\.layers\.\d+\.(mlp|shared_expert)\.down_proj": "row",
        r"model\.layers\.\d+\.mlp\.experts": "experts",
        r"model\.embed_tokens": "vocab",
        r"lm_head": "head",
    }

    def __init__(self, config: ArchConfig) -> None:
        super().__init__()
        self.config = config
        self.model = _Backbone(config, self.layer)
        if not config.tie_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rope = RotaryEmbedding(config.rope_dim, config.rope_theta)

    def parts(self):
        m = self.model
        return m.embed_tokens, m.layers, m.norm, None if self.config.tie_embeddings else self.lm_head
