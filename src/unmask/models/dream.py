"""Dream's configuration (Qwen2 layout, run bidirectionally by unmask.models.qwen.QwenModel, whose
parameter names equal the released checkpoint keys; q/k/v carry biases).

Dream was initialised from an autoregressive model: the hidden state at position j predicts the
token at j + 1 (ArchConfig.logit_shift = 1). The engine, not the model, aligns logits to tokens.
"""

from unmask.errors import CheckpointError
from unmask.models.base import ArchConfig, cfg_float, cfg_int


def dream_arch(cfg: dict) -> ArchConfig:
    if cfg.get("rope_scaling"):
        raise CheckpointError(f"config.json: unsupported Dream option rope_scaling={cfg['rope_scaling']!r}")
    heads = cfg_int(cfg, "num_attention_heads", family="Dream")
    tie = cfg.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise CheckpointError(f"config.json: tie_word_embeddings {tie!r} must be true or false")
    return ArchConfig(
        family="dream",
        vocab_size=cfg_int(cfg, "vocab_size", family="Dream"),
        hidden_size=cfg_int(cfg, "hidden_size", family="Dream"),
        num_layers=cfg_int(cfg, "num_hidden_layers", family="Dream"),
        num_heads=heads,
        num_kv_heads=cfg_int(cfg, "num_key_value_heads", heads),
        intermediate_size=cfg_int(cfg, "intermediate_size", family="Dream"),
        rope_theta=cfg_float(cfg, "rope_theta", 10000.0),
        norm_eps=cfg_float(cfg, "rms_norm_eps", 1e-6),
        max_positions=cfg_int(cfg, "max_position_embeddings", 2048),
        tie_embeddings=tie,
        qkv_bias=True,
        logit_shift=1,
    )
