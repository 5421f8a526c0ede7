"""LLaDA-MoE (inclusionAI LLaDA-MoE-7B-A1B; `LLaDAMoEModelLM`, model_type "lladamoe" or "llada"
with that architecture): a masked-diffusion mixture of experts in the OLMoE layout, bidirectional
over the whole sequence like LLaDA. Parameter names equal the released checkpoint keys:
model.embed_tokens, model.layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj, self_attn.
{q_norm, k_norm}, post_attention_layernorm, mlp.gate, mlp.experts.{e}.{gate,up,down}_proj,
mlp.expert_bias (when moe_router_enable_expert_bias), shared_expert.{gate,up,down}_proj}, model.norm,
lm_head. A layer whose moe_layer_freq entry is 0 has a dense `mlp.{gate,up,down}_proj` of
dense_intermediate_size (and no shared expert).

Router as its modeling code computes it: softmax over the experts in float32, plus the expert bias
when present, top-k of those values as the weights, not renormalised (the code fixes
norm_topk_prob to False whatever the config says).
"""

from torch import nn

from unmask.errors import CheckpointError
from unmask.layers.moe import MoEConfig, Router, SparseMoE
from unmask.layers.norm import RMSNorm
from unmask.models.base import ArchConfig, cfg_flag, cfg_float, cfg_int
from unmask.models.qwen import GatedMLP, QwenAttention, QwenModel

F = "LLaDA-MoE"


def llada_moe_arch(cfg: dict) -> ArchConfig:
    if cfg.get("rope_scaling"):
        raise CheckpointError(f"config.json: unsupported LLaDA-MoE option rope_scaling={cfg['rope_scaling']!r}")
    if cfg.get("clip_qkv") is not None:
        raise CheckpointError(f"config.json: unsupported LLaDA-MoE option clip_qkv={cfg['clip_qkv']!r}")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"config.json: unsupported LLaDA-MoE option hidden_act={act!r} (supported: 'silu')")
    score = cfg.get("moe_router_score_function") or "softmax"
    if score != "softmax":
        raise CheckpointError(f"config.json: unsupported LLaDA-MoE option moe_router_score_function={score!r} "
                              "(its modeling code applies softmax)")
    layers = cfg_int(cfg, "num_hidden_layers", family=F)
    freq = cfg.get("moe_layer_freq")
    if freq is None:
        freq = [1] * layers
    if not isinstance(freq, list) or len(freq) != layers or any(v not in (0, 1) or isinstance(v, bool) for v in freq):
        raise CheckpointError(f"config.json: moe_layer_freq {freq!r} must list 0 (dense) or 1 (MoE) for each of the "
                              f"{layers} layers")
    heads = cfg_int(cfg, "num_attention_heads", family=F)
    hidden = cfg_int(cfg, "hidden_size", family=F)
    head_dim = hidden // heads
    factor = cfg_float(cfg, "partial_rotary_factor", 1.0)
    if not 0 < factor <= 1:
        raise CheckpointError(f"config.json: partial_rotary_factor {factor!r} must be in (0, 1]")
    shared = cfg_int(cfg, "shared_expert_intermediate_size", 0)
    moe = MoEConfig(num_experts=cfg_int(cfg, "num_experts", family=F), top_k=cfg_int(cfg, "num_experts_per_tok", family=F),
                    expert_size=cfg_int(cfg, "expert_intermediate_size", family=F), shared_size=max(shared, 0),
                    dense_layers=tuple(i for i, v in enumerate(freq) if v == 0), score="softmax", norm_topk=False,
                    expert_bias=cfg_flag(cfg, "moe_router_enable_expert_bias", False))
    dense = cfg_int(cfg, "dense_intermediate_size", 0)
    if moe.dense_layers and dense < 1:
        raise CheckpointError(f"config.json: dense_intermediate_size {dense!r} must be positive (moe_layer_freq has "
                              "dense layers)")
    bias = cfg_flag(cfg, "attention_bias", False)
    return ArchConfig(
        family="llada_moe",
        vocab_size=cfg_int(cfg, "vocab_size", family=F),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=cfg_int(cfg, "num_key_value_heads", heads),
        intermediate_size=dense if moe.dense_layers else 1,  # the dense layers' MLP (unused without any)
        rope_theta=cfg_float(cfg, "rope_theta", 10000.0),
        norm_eps=cfg_float(cfg, "rms_norm_eps", 1e-5),
        max_positions=cfg_int(cfg, "max_position_embeddings", 4096),
        tie_embeddings=cfg_flag(cfg, "tie_word_embeddings", False),
        qkv_bias=bias,
        attn_out_bias=bias,
        qk_norm=cfg_flag(cfg, "qk_layernorm", False),
        rotary_dim=int(head_dim * factor),
        moe=moe,
    )


class _Layer(nn.Module):
    """Qwen-layout attention, then a dense MLP or the routed experts with the shared expert."""

    def __init__(self, c: ArchConfig, i: int) -> None:
        super().__init__()
        m = c.moe
        self.input_layernorm = RMSNorm(c.hidden_size, c.norm_eps)
        self.self_attn = QwenAttention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.norm_eps)
        self.moe = m.is_moe(i)
        if self.moe:
            self.mlp = SparseMoE(m, c.hidden_size, Router(m.num_experts, c.hidden_size, False), bias_here=True)
            if m.shared_size:
                self.shared_expert = GatedMLP(c.hidden_size, m.shared_size)
        else:
            self.mlp = GatedMLP(c.hidden_size, c.intermediate_size)
        self.heads = (c.num_heads, c.num_kv_heads)

    def forward(self, x, rope, kv, layer, kv_start, mask):
        x = x + self.self_attn(self.input_layernorm(x), self.heads, rope, kv, layer, kv_start, mask)
        h = self.post_attention_layernorm(x)
        y = self.mlp(h)
        if self.moe and hasattr(self, "shared_expert"):
            y = y + self.shared_expert(h)
        return x + y


class LLaDAMoEModel(QwenModel):
    """The Qwen-layout decoder (model.{embed_tokens, layers, norm}, lm_head) with LLaDA-MoE's layers."""

    layer = _Layer
