"""Block-diffusion checkpoints in the Qwen layouts (no remote code): Fast-dLLM v2 and SDAR.

Both run the Qwen decoder (unmask.models.qwen.QwenModel: the same parameter names) with
block-causal attention over blocks of `bd_size` positions (ArchConfig.block_size).

- Fast-dLLM v2 (`Efficient-Large-Model/Fast_dLLM_v2_7B`, model_type "Fast_dLLM_Qwen"): Qwen2.5
  weights (q/k/v biases), `bd_size` in config.json (32), token shift (hidden j scores token j + 1,
  so a block's first token is proposed by the last position of the block before), mask token
  `|<MASK>|` (151665), stop `<|im_end|>` (151645).
- SDAR (JetAstra, model_type "sdar"): Qwen3 weights (per-head q_norm / k_norm before RoPE, explicit
  head_dim, no q/k/v biases unless attention_bias), no token shift (each position scores its own
  token), mask `<|MASK|>` (151669). Its config has no block field: the block is a decoding
  argument of its generate script, released default 4, used here unless config.json sets bd_size.
"""

from dataclasses import dataclass

from unmask.errors import CheckpointError
from unmask.models.base import ArchConfig, cfg_flag, cfg_float, cfg_int

SDAR_BLOCK = 4

# decoding settings each family's release recommends, used where the folder's
# generation_config.json says nothing: Fast-dLLM v2's eval (threshold 0.9 over sub-blocks of 8 in
# blocks of 32, no block-level cache); SDAR's generate script (low_confidence_dynamic with
# threshold 0.85 and at least one token per step: unmask's threshold policy, which commits the
# most confident position when none passes).
RELEASED_DEFAULTS = {
    "fast_dllm_v2": {"policy": "threshold", "threshold": 0.9, "block_length": 8, "cache": "exact"},
    "sdar": {"policy": "threshold", "threshold": 0.85, "cache": "exact"},
}


def _refuse(cfg: dict, family: str) -> None:
    if cfg.get("rope_scaling"):
        raise CheckpointError(f"config.json: unsupported {family} option rope_scaling={cfg['rope_scaling']!r}")
    if cfg_flag(cfg, "use_sliding_window", False):
        raise CheckpointError(f"config.json: unsupported {family} option use_sliding_window=true")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"config.json: unsupported {family} option hidden_act={act!r} (supported: 'silu')")


def _theta(cfg: dict, family: str) -> float:
    """rope_theta: top-level (transformers 4 configs) or in rope_parameters (transformers 5)."""
    rope = cfg.get("rope_parameters") or {}
    if not isinstance(rope, dict) or rope.get("rope_type", "default") != "default":
        raise CheckpointError(f"config.json: unsupported {family} option rope_parameters={rope!r}")
    return cfg_float(rope, "rope_theta", None) if rope.get("rope_theta") is not None else cfg_float(
        cfg, "rope_theta", 10000.0)


def qwen_arch(cfg: dict, family: str, label: str | None = None, **extra) -> ArchConfig:
    """The ArchConfig of a config.json in transformers' Qwen2 / Qwen3 / Llama field names; `label`
    names the family in errors (default: `family`)."""
    label = label or family
    _refuse(cfg, label)
    heads = cfg_int(cfg, "num_attention_heads", family=label)
    return ArchConfig(
        family=family,
        vocab_size=cfg_int(cfg, "vocab_size", family=label),
        hidden_size=cfg_int(cfg, "hidden_size", family=label),
        num_layers=cfg_int(cfg, "num_hidden_layers", family=label),
        num_heads=heads,
        num_kv_heads=cfg_int(cfg, "num_key_value_heads", heads),
        intermediate_size=cfg_int(cfg, "intermediate_size", family=label),
        rope_theta=_theta(cfg, label),
        norm_eps=cfg_float(cfg, "rms_norm_eps", 1e-6),
        max_positions=cfg_int(cfg, "max_position_embeddings", 32768),
        tie_embeddings=cfg_flag(cfg, "tie_word_embeddings", False),
        **extra,
    )


def fast_dllm_v2_arch(cfg: dict) -> ArchConfig:
    block = cfg_int(cfg, "bd_size", family="Fast-dLLM v2")
    if block < 1:
        raise CheckpointError(f"config.json: bd_size {block!r} must be a positive integer")
    return qwen_arch(cfg, "fast_dllm_v2", qkv_bias=True, logit_shift=1, block_size=block)


def sdar_arch(cfg: dict) -> ArchConfig:
    block = cfg_int(cfg, "bd_size", SDAR_BLOCK)
    if block < 1:
        raise CheckpointError(f"config.json: bd_size {block!r} must be a positive integer")
    return qwen_arch(cfg, "sdar", qkv_bias=cfg_flag(cfg, "attention_bias", False), logit_shift=0, block_size=block,
                 head_size=cfg_int(cfg, "head_dim", 0), qk_norm=True)


def qwen3_arch(cfg: dict) -> ArchConfig:
    """Qwen3 (`Qwen3ForCausalLM`): an autoregressive target (DFlash's released drafters are trained
    for Qwen3 targets). The Qwen decoder run causally, with per-head q/k norms and head_dim."""
    return qwen_arch(cfg, "qwen3", qkv_bias=cfg_flag(cfg, "attention_bias", False), causal=True,
                 head_size=cfg_int(cfg, "head_dim", 0), qk_norm=True)


# diffusion models released with an unchanged Qwen2 config (nothing in it says they are not
# autoregressive): recognised by the release's name, never run causally
QWEN2_DIFFUSION_RELEASES = ("open-dcoder",)


@dataclass(frozen=True)
class Qwen2Release:
    """What a diffusion release in the Qwen2 layout keeps that its reference sampler reads:
    config.json's own pad_token_id (Open-dCoder's sampler masks that id out of attention)."""

    name: str
    config_pad_id: int | None


def qwen2_released(folder) -> dict:
    """What a folder's name says of a Qwen2 config (unmask.models.registry.Family.released)."""
    from pathlib import Path

    names = [part.lower() for part in Path(folder).resolve().parts[-3:]]
    hit = next((r for r in QWEN2_DIFFUSION_RELEASES for n in names if r in n), None)
    return {"_diffusion_release": hit} if hit else {}


def qwen2_arch(cfg: dict) -> ArchConfig:
    """Qwen2 / Qwen2.5 (`Qwen2ForCausalLM`): autoregressive, run causally (q/k/v biases): the
    parent of A2D-Qwen2 models and their AR baseline. A folder of Open-dCoder
    (pengzhangzhi/Open-dLLM, `fredzzp/open-dcoder-0.5B`), whose config.json is Qwen2's unchanged,
    is that masked diffusion model: bidirectional, hidden state j scoring token j + 1 (Dream's
    shift), its sampler `compat open-dcoder`."""
    if cfg.get("_diffusion_release") == "open-dcoder":
        pad = cfg.get("pad_token_id")
        if pad is not None and (isinstance(pad, bool) or not isinstance(pad, int)):
            raise CheckpointError(f"config.json: pad_token_id {pad!r} must be an integer")
        return qwen_arch(cfg, "open_dcoder", label="Open-dCoder", qkv_bias=True, logit_shift=1,
                         layout=Qwen2Release("open-dcoder", pad))
    return qwen_arch(cfg, "qwen2", qkv_bias=True, causal=True)
