"""LLaDA (OLMo-derived, block_type "llama"). Parameter names equal the released checkpoint keys:
model.transformer.{wte, blocks.{i}.{attn_norm, q_proj, k_proj, v_proj, attn_out, ff_norm, ff_proj,
up_proj, ff_out}, ln_f, ff_out}."""

from torch import nn

from unmask.errors import CheckpointError
from unmask.layers.blocks import self_attention, swiglu
from unmask.layers.norm import RMSNorm
from unmask.layers.rope import RotaryEmbedding
from unmask.models.base import ArchConfig, DiffusionLM, cfg_float, cfg_int

# config.json values this implementation reproduces; anything else is refused by name.
_REQUIRED = {
    "block_type": "llama",
    "layer_norm_type": "rms",
    "activation_type": "silu",
    "alibi": False,
    "include_bias": False,
    "scale_logits": False,
    "rope": True,
    "block_group_size": 1,
}


def llada_arch(cfg: dict) -> ArchConfig:
    for key, want in _REQUIRED.items():
        if key in cfg and cfg[key] != want:
            raise CheckpointError(f"config.json: unsupported LLaDA option {key}={cfg[key]!r} (supported: {want!r})")
    d, heads = cfg_int(cfg, "d_model", family="LLaDA"), cfg_int(cfg, "n_heads", family="LLaDA")
    hidden = cfg_int(cfg, "mlp_hidden_size", None)
    if hidden is None:
        hidden = cfg_int(cfg, "mlp_ratio", 4) * d
    vocab = cfg_int(cfg, "embedding_size", None)
    return ArchConfig(
        family="llada",
        vocab_size=vocab if vocab is not None else cfg_int(cfg, "vocab_size", family="LLaDA"),
        hidden_size=d,
        num_layers=cfg_int(cfg, "n_layers", family="LLaDA"),
        num_heads=heads,
        num_kv_heads=cfg_int(cfg, "n_kv_heads", heads),
        intermediate_size=hidden,
        rope_theta=cfg_float(cfg, "rope_theta", 10000.0),
        norm_eps=cfg_float(cfg, "rms_norm_eps", 1e-5),
        max_positions=cfg_int(cfg, "max_sequence_length", 4096),
        tie_embeddings=_flag(cfg, "weight_tying"),
        qkv_bias=_flag(cfg, "include_qkv_bias"),
        causal=_flag(cfg, "causal"),
        logit_shift=_logit_shift(cfg.get("logit_shift", 0)),
        block_size=cfg_int(cfg, "bd_size", 0),
    )


def _flag(cfg: dict, key: str) -> bool:
    v = cfg.get(key, False)
    if not isinstance(v, bool):
        raise CheckpointError(f"config.json: {key} {v!r} must be true or false")
    return v


def _logit_shift(value) -> int:
    """unmask extension: a diffusion model adapted from its AR twin may keep the AR alignment
    (logits at position j score the token at j + 1), as Dream did from Qwen."""
    if value not in (0, 1) or isinstance(value, bool):
        raise CheckpointError(f"config.json: logit_shift {value!r} must be 0 or 1")
    return int(value)


class LLaDABlock(nn.Module):
    def __init__(self, c: ArchConfig) -> None:
        super().__init__()
        d, hd = c.hidden_size, c.head_dim
        self.attn_norm = RMSNorm(d, c.norm_eps)
        self.q_proj = nn.Linear(d, c.num_heads * hd, bias=c.qkv_bias)
        self.k_proj = nn.Linear(d, c.num_kv_heads * hd, bias=c.qkv_bias)
        self.v_proj = nn.Linear(d, c.num_kv_heads * hd, bias=c.qkv_bias)
        self.attn_out = nn.Linear(c.num_heads * hd, d, bias=False)
        self.ff_norm = RMSNorm(d, c.norm_eps)
        self.ff_proj = nn.Linear(d, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(d, c.intermediate_size, bias=False)
        self.ff_out = nn.Linear(c.intermediate_size, d, bias=False)
        self.heads = (c.num_heads, c.num_kv_heads)

    def forward(self, x, rope, kv, layer, kv_start, key_mask):
        h = self.attn_norm(x)
        x = x + self_attention(
            h, self.q_proj, self.k_proj, self.v_proj, self.attn_out, *self.heads, rope, kv, layer, kv_start, key_mask
        )
        return x + swiglu(self.ff_norm(x), self.ff_proj, self.up_proj, self.ff_out)


class _Transformer(nn.Module):
    def __init__(self, c: ArchConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(c.vocab_size, c.hidden_size)
        self.blocks = nn.ModuleList(LLaDABlock(c) for _ in range(c.num_layers))
        self.ln_f = RMSNorm(c.hidden_size, c.norm_eps)
        if not c.tie_embeddings:
            self.ff_out = nn.Linear(c.hidden_size, c.vocab_size, bias=False)


class _Inner(nn.Module):
    def __init__(self, c: ArchConfig) -> None:
        super().__init__()
        self.transformer = _Transformer(c)


class LLaDAModel(DiffusionLM):
    tp_plan = {
        r"model\.transformer\.blocks\.\d+\.(q_proj|ff_proj|up_proj)": "col",
        r"model\.transformer\.blocks\.\d+\.(k_proj|v_proj)": "kv",
        r"model\.transformer\.blocks\.\d+\.(attn_out|ff_out)": "row",
        r"model\.transformer\.wte": "vocab",
        r"model\.transformer\.ff_out": "head",
    }

    def __init__(self, config: ArchConfig) -> None:
        super().__init__()
        self.config = config
        self.model = _Inner(config)
        self.rope = RotaryEmbedding(config.head_dim, config.rope_theta)

    def parts(self):
        t = self.model.transformer
        return t.wte, t.blocks, t.ln_f, None if self.config.tie_embeddings else t.ff_out
