"""LLaDA2.x (inclusionAI LLaDA2.0 / LLaDA2.1, mini and flash; model_type "llada2_moe",
`LLaDA2MoeModelLM`): a block-diffusion mixture of experts. Parameter names equal the released
checkpoint keys: model.word_embeddings, model.layers.{i}.{input_layernorm, attention.
{query_key_value, query_layernorm, key_layernorm, dense}, post_attention_layernorm, mlp}, model.norm,
lm_head. Layer i < first_k_dense_replace has a dense SwiGLU `mlp.{gate,up,down}_proj`; the others
`mlp.gate.{weight, expert_bias}` (a sigmoid router in float32 with group-limited top-k),
`mlp.experts.{e}.{gate,up,down}_proj` and `mlp.shared_experts.{gate,up,down}_proj`.

Attention: one fused query/key/value projection (query heads, then key heads, then value
heads), per-head RMSNorm of queries and keys (use_qk_norm), rotary embedding of the first
partial_rotary_factor of each head. Block diffusion: the remote code's `generate` attends
block-causally over blocks of `block_length` counted from position 0 (32 in the releases); its
config has no block field, so unmask reads `bd_size` if present, else the released 32. No token
shift: each position scores its own token.
"""

from torch import nn

from unmask.errors import CheckpointError
from unmask.layers.blocks import fused_self_attention
from unmask.layers.moe import MoEConfig, Router, SparseMoE
from unmask.layers.norm import RMSNorm
from unmask.layers.rope import RotaryEmbedding
from unmask.models.base import ArchConfig, DiffusionLM, cfg_flag, cfg_float, cfg_int
from unmask.models.qwen import GatedMLP

LLADA2_BLOCK = 32
F = "LLaDA2"


def llada2_arch(cfg: dict) -> ArchConfig:
    if cfg.get("rope_scaling"):
        raise CheckpointError(f"config.json: unsupported LLaDA2 option rope_scaling={cfg['rope_scaling']!r}")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"config.json: unsupported LLaDA2 option hidden_act={act!r} (supported: 'silu')")
    score = cfg.get("score_function", "sigmoid")
    if score != "sigmoid":
        raise CheckpointError(f"config.json: unsupported LLaDA2 option score_function={score!r} (supported: 'sigmoid')")
    if cfg_flag(cfg, "norm_head", False):
        raise CheckpointError("config.json: unsupported LLaDA2 option norm_head=true")
    heads = cfg_int(cfg, "num_attention_heads", family=F)
    kv_heads = cfg_int(cfg, "num_key_value_heads", 0) or heads
    hidden = cfg_int(cfg, "hidden_size", family=F)
    head_dim = cfg_int(cfg, "head_dim", 0) or hidden // heads
    factor = cfg_float(cfg, "partial_rotary_factor", 1.0)
    if not 0 < factor <= 1:
        raise CheckpointError(f"config.json: partial_rotary_factor {factor!r} must be in (0, 1]")
    layers = cfg_int(cfg, "num_hidden_layers", family=F)
    experts = cfg_int(cfg, "num_experts", 0)
    moe = None
    if experts:
        shared = cfg_int(cfg, "num_shared_experts", 0)
        size = cfg_int(cfg, "moe_intermediate_size", family=F)
        moe = MoEConfig(num_experts=experts, top_k=cfg_int(cfg, "num_experts_per_tok", family=F), expert_size=size,
                        shared_size=size * shared, first_dense=cfg_int(cfg, "first_k_dense_replace", 0),
                        score="sigmoid", n_group=cfg_int(cfg, "n_group", 1), topk_group=cfg_int(cfg, "topk_group", 1),
                        routed_scale=cfg_float(cfg, "routed_scaling_factor", 1.0), norm_topk=True, expert_bias=True)
    dense = cfg_int(cfg, "intermediate_size", None)
    if dense is None and (moe is None or moe.first_dense > 0):
        raise CheckpointError("config.json: LLaDA2 config lacks required field 'intermediate_size' (its dense layers)")
    block = cfg_int(cfg, "bd_size", LLADA2_BLOCK)
    if block < 1:
        raise CheckpointError(f"config.json: bd_size {block!r} must be a positive integer")
    return ArchConfig(
        family="llada2",
        vocab_size=cfg_int(cfg, "vocab_size", family=F),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        intermediate_size=dense or 1,
        rope_theta=cfg_float(cfg, "rope_theta", 10000.0),
        norm_eps=cfg_float(cfg, "rms_norm_eps", 1e-5),
        max_positions=cfg_int(cfg, "max_position_embeddings", 16384),
        tie_embeddings=cfg_flag(cfg, "tie_word_embeddings", False),
        qkv_bias=cfg_flag(cfg, "use_qkv_bias", False),
        attn_out_bias=cfg_flag(cfg, "use_bias", True),
        qk_norm=cfg_flag(cfg, "use_qk_norm", True),
        head_size=head_dim if head_dim * heads != hidden else 0,
        rotary_dim=int(head_dim * factor),
        block_size=block,
        moe=moe,
    )


class _Attention(nn.Module):
    def __init__(self, c: ArchConfig) -> None:
        super().__init__()
        hd = c.head_dim
        self.query_key_value = nn.Linear(c.hidden_size, (c.num_heads + 2 * c.num_kv_heads) * hd, bias=c.qkv_bias)
        if c.qk_norm:
            self.query_layernorm = RMSNorm(hd, c.norm_eps)
            self.key_layernorm = RMSNorm(hd, c.norm_eps)
        self.dense = nn.Linear(c.num_heads * hd, c.hidden_size, bias=c.attn_out_bias)


class _MoE(SparseMoE):
    def __init__(self, c: ArchConfig) -> None:
        m = c.moe
        super().__init__(m, c.hidden_size, Router(m.num_experts, c.hidden_size, m.expert_bias))
        if m.shared_size:
            self.shared_experts = GatedMLP(c.hidden_size, m.shared_size)

    def forward(self, x):
        y = super().forward(x)
        return y + self.shared_experts(x) if self.c.shared_size else y


class _Layer(nn.Module):
    def __init__(self, c: ArchConfig, i: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.norm_eps)
        self.attention = _Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.norm_eps)
        self.mlp = _MoE(c) if c.moe and c.moe.is_moe(i) else GatedMLP(c.hidden_size, c.intermediate_size)
        self.heads = (c.num_heads, c.num_kv_heads)

    def forward(self, x, rope, kv, layer, kv_start, mask):
        a = self.attention
        h = self.input_layernorm(x)
        x = x + fused_self_attention(h, a.query_key_value, a.dense, *self.heads, rope, kv, layer, kv_start, mask,
                                     getattr(a, "query_layernorm", None), getattr(a, "key_layernorm", None))
        return x + self.mlp(self.post_attention_layernorm(x))


class _Inner(nn.Module):
    def __init__(self, c: ArchConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(_Layer(c, i) for i in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.norm_eps)


class LLaDA2Model(DiffusionLM):
    tp_plan = {
        r"model\.layers\.\d+\.attention\.query_key_value": "qkv",
        r"model\.layers\.\d+\.attention\.dense": "row",
        r"model\.layers\.\d+\.mlp(\.shared_experts)?\.(gate_proj|up_proj)": "col",
        r"model\.layers\.\d+\.mlp(\.shared_experts)?\.down_proj": "row",
        r"model\.layers\.\d+\.mlp\.experts": "experts",
        r"model\.word_embeddings": "vocab",
        r"lm_head": "head",
    }

    def __init__(self, config: ArchConfig) -> None:
        super().__init__()
        self.config = config
        self.model = _Inner(config)
        if not config.tie_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rope = RotaryEmbedding(config.rope_dim, config.rope_theta)

    def parts(self):
        m = self.model
        return m.word_embeddings, m.layers, m.norm, None if self.config.tie_embeddings else self.lm_head
