"""dllm's A2D checkpoints ("AR to diffusion", ZHZisZZ/dllm `dllm/pipelines/a2d`): an autoregressive
Qwen2, Qwen3 or Llama model whose attention was made bidirectional, then trained as a masked
diffusion model (MDLM: the whole canvas) or a block diffusion model (BD3LM: blocks of, in the
released Tiny-A2D models, 32 positions). Released as `dllm-hub/Qwen3-0.6B-diffusion-{mdlm,bd3lm}-v0.1`
and `dllm-hub/Qwen2.5-Coder-0.5B-Instruct-diffusion-{mdlm,bd3lm}-v0.1`.

config.json is the base model's config with `model_type` "a2d-qwen2", "a2d-qwen3" or "a2d-llama"
(transformers' Qwen2Config / Qwen3Config / LlamaConfig fields; architectures
`A2D{Qwen2,Qwen3,Llama}LMHeadModel`), and the weights keep the base model's names
(model.embed_tokens, model.layers.{i}.self_attn.{q,k,v,o}_proj, ..., model.norm, lm_head): the
Qwen-layout decoder (unmask.models.qwen.QwenModel) runs all three, each position scoring its own
token (dllm's samplers run A2D models with `right_shift_logits` off). The mask token is the
tokenizer's (`<|mask|>` as dllm's tokenizer set-up adds it; unmask.tokenizer).

Whether a checkpoint was trained as MDLM or BD3LM is not in its config (the block is a training
and sampling argument). A folder whose config.json says `block_size` (or `bd_size`) is run as a
block-diffusion model with that block; so is a folder of a known BD3LM release (RELEASES, by the
release's name: the folder's own, or the Hub cache's `models--dllm-hub--NAME`), with the block it
was trained with; otherwise it is a full-attention model. The samplers themselves are `compat
dllm-mdlm` / `dllm-bd3lm` (unmask.reference.dllm), on either.
"""

from pathlib import Path

from unmask.errors import CheckpointError
from unmask.models.base import ArchConfig, cfg_flag, cfg_int
from unmask.models.blockdiff import qwen_arch

# how dllm renders an A2D model's chat template (dllm.utils.get_tokenizer: for the Qwen bases,
# enable_thinking false unless asked; the model cards recommend it)
TEMPLATE_VARS = {"enable_thinking": False}
# dllm-hub's BD3LM releases and the block they were trained with (examples/a2d/bd3lm: block_size 32)
RELEASES = {"Qwen3-0.6B-diffusion-bd3lm-v0.1": 32, "Qwen2.5-Coder-0.5B-Instruct-diffusion-bd3lm-v0.1": 32}
BASES = {"a2d-qwen2": "Qwen2", "a2d-qwen3": "Qwen3", "a2d-llama": "Llama"}
ARCHITECTURES = ("A2DQwen2LMHeadModel", "A2DQwen3LMHeadModel", "A2DLlamaLMHeadModel")
_BY_ARCH = dict(zip(ARCHITECTURES, BASES))


def a2d_arch(cfg: dict) -> ArchConfig:
    model_type = str(cfg.get("model_type", "")).lower()
    if model_type not in BASES:
        archs = [a for a in cfg.get("architectures") or [] if a in _BY_ARCH]
        if not archs:
            raise CheckpointError(f"config.json: model_type {cfg.get('model_type')!r} is not an A2D layout "
                                  f"({', '.join(BASES)})")
        model_type = _BY_ARCH[archs[0]]
    base = BASES[model_type]
    family = f"A2D ({base})"
    if base == "Llama" and cfg_flag(cfg, "mlp_bias", False):
        raise CheckpointError("config.json: unsupported A2D (Llama) option mlp_bias=true")
    if base == "Llama" and cfg_int(cfg, "pretraining_tp", 1) != 1:
        raise CheckpointError(f"config.json: unsupported A2D (Llama) option pretraining_tp={cfg['pretraining_tp']!r}")
    block = cfg_int(cfg, "block_size", 0) or cfg_int(cfg, "bd_size", 0)
    if block < 0:
        raise CheckpointError(f"config.json: block_size {block!r} must be a positive integer")
    # Qwen2 always has q/k/v biases and none on o_proj; Qwen3 and Llama put `attention_bias` on all four
    bias = True if base == "Qwen2" else cfg_flag(cfg, "attention_bias", False)
    return qwen_arch(cfg, "a2d", qkv_bias=bias, attn_out_bias=bias and base != "Qwen2", block_size=block,
                     head_size=cfg_int(cfg, "head_dim", 0), qk_norm=base == "Qwen3", label=family)


def released(folder: Path) -> dict:
    """config.json fields a known release implies but does not write (its training block)."""
    for part in reversed(Path(folder).resolve().parts):
        name = part.removeprefix("models--dllm-hub--")
        if name in RELEASES:
            return {"block_size": RELEASES[name]}
    return {}
