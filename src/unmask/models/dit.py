"""MDLM and BD3-LM (kuleshov-group: `kuleshov-group/mdlm-owt`, `kuleshov-group/bd3lm-owt-block_size{4,8,16}`):
the diffusion transformer ("DiT") of MDLM (Sahoo et al. 2024) and BD3-LM (Arriola et al. 2025),
GPT-2's tokenizer plus one mask token, trained on OpenWebText, unconditional.

config.json is the release's BD3LMConfig / MDLMConfig (model_type "bd3lm" / "mdlm"): hidden_dim,
n_blocks, n_heads, cond_dim, vocab_size (GPT-2's 50257 + the mask, the last id), model_length,
block_size, cross_attn (BD3-LM's block attention), adaln, causal, time_conditioning. The weights
keep the release's names (bd3lms `models/hf/modeling_bd3lm.py`, the same as `models/dit.py`):
backbone.vocab_embed.embedding, backbone.sigma_map.mlp.{0,2}, backbone.blocks.{i}.{norm1, attn_qkv,
attn_out, norm2, mlp.{0,2}, adaLN_modulation}, backbone.output_layer.{norm_final, linear,
adaLN_modulation}.

A block: LayerNorm without bias (in float32, times its weight), modulated by the adaLN shift and
scale; one fused q/k/v projection (query heads, key heads, value heads) with rotary embeddings over
the whole head (base 10000); attention (BD3-LM: "key block <= query block", blocks of block_size
from position 0; MDLM: full); the attention output times the adaLN gate added to the residual;
then LayerNorm, modulation, a GELU (tanh) MLP with biases, gated. The final layer: LayerNorm,
modulation, a linear head with bias.

The adaLN conditioning is the noise level sigma through a sinusoidal timestep embedding and an
MLP; the released models are trained without time conditioning (`time_conditioning` false: sigma is
always 0), so the conditioning is one constant vector: computed per forward as the release does.
A release with time conditioning is refused by name (its output depends on a noise level unmask's
samplers do not carry).

The output distribution never holds the mask token (the "subs" parameterization: the mask logit is
-infinity before the softmax); this model returns it so. The samplers are `compat bd3lms`
(unmask.reference.bd3lms); native decoding runs BD3-LM with its blocks (the exact cache) and MDLM
as a full-attention model.

The releases ship no tokenizer: they use GPT-2's (`openai-community/gpt2`; TOKENIZER_FROM).
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from unmask.errors import CheckpointError
from unmask.layers.blocks import fused_self_attention
from unmask.layers.rope import RotaryEmbedding
from unmask.models.base import ArchConfig, DiffusionLM, cfg_flag, cfg_int, select_positions

# the tokenizer the releases were trained with (their model cards load it by this name)
TOKENIZER_FROM = "openai-community/gpt2"
FREQ_DIM = 256  # the timestep embedding's sinusoid size (TimestepEmbedder's frequency_embedding_size)
MLP_RATIO = 4


@dataclass(frozen=True)
class DiTLayout:
    """What the DiT has that ArchConfig does not describe."""

    cond_dim: int
    adaln: bool
    # the release's own sampler facts (bd3lms): its block (the whole model_length for MDLM)
    sampler_block: int

    def num_parameters(self, c: ArchConfig, embeddings: bool, active: bool) -> int:
        d, f, cd = c.hidden_size, c.intermediate_size, self.cond_dim
        per = 3 * d * d + d * d + 2 * d + d * f + f + f * d + d + ((cd + 1) * 6 * d if self.adaln else 0)
        total = c.num_layers * per + d + ((cd + 1) * 2 * d if self.adaln else 0)
        total += (FREQ_DIM + 1) * cd + (cd + 1) * cd if self.adaln else 0
        if embeddings:
            total += 2 * c.vocab_size * d + c.vocab_size
        return total


def dit_arch(cfg: dict) -> ArchConfig:
    model_type = str(cfg.get("model_type", "")).lower() or ("bd3lm" if "BD3LM" in (cfg.get("architectures") or [])
                                                              else "mdlm")
    label = {"bd3lm": "BD3-LM", "mdlm": "MDLM"}.get(model_type, "BD3-LM")
    if cfg_flag(cfg, "time_conditioning", False):
        raise CheckpointError(f"config.json: unsupported {label} option time_conditioning=true (unmask runs the "
                              "released models, trained without it: their output does not depend on the noise level)")
    backend = cfg.get("attn_backend", "flex")
    if backend not in ("flex", "sdpa", "flash_attn"):
        raise CheckpointError(f"config.json: unsupported {label} option attn_backend={backend!r} "
                              "(supported: 'flex', 'sdpa', 'flash_attn': the same attention)")
    d = cfg_int(cfg, "hidden_dim", family=label)
    heads = cfg_int(cfg, "n_heads", family=label)
    length = cfg_int(cfg, "model_length", family=label)
    cross = cfg_flag(cfg, "cross_attn", model_type == "bd3lm")
    causal = cfg_flag(cfg, "causal", False)
    block = cfg_int(cfg, "block_size", length if model_type == "mdlm" else 1)
    if block < 1:
        raise CheckpointError(f"config.json: block_size {block!r} must be a positive integer")
    if cross and causal:
        raise CheckpointError(f"config.json: {label} is either causal or block-diffusion (cross_attn), not both")
    cond = cfg_int(cfg, "cond_dim", family=label)
    if cond < 1:
        raise CheckpointError(f"config.json: cond_dim {cond!r} must be a positive integer")
    return ArchConfig(
        # what it runs as: BD3-LM with its block attention, MDLM (no cross_attn: full attention)
        family="bd3lm" if cross else "mdlm",
        vocab_size=cfg_int(cfg, "vocab_size", family=label),
        hidden_size=d,
        num_layers=cfg_int(cfg, "n_blocks", family=label),
        num_heads=heads,
        num_kv_heads=heads,
        intermediate_size=MLP_RATIO * d,
        rope_theta=10000.0,
        norm_eps=1e-5,
        max_positions=length,
        causal=causal,
        # BD3-LM's sampling mask is "key block <= query block" over blocks of block_size (cross_attn);
        # without cross_attn the model attends to everything (MDLM)
        block_size=block if cross else 0,
        layout=DiTLayout(cond, cfg_flag(cfg, "adaln", True), block),
    )


def token_defaults(cfg: dict) -> dict:
    """The mask is the id after GPT-2's vocabulary: the last of the model's (bd3lms: `mask_index` =
    the tokenizer's vocab_size when it has no mask token)."""
    vocab = cfg.get("vocab_size")
    return {"mask_token_id": vocab - 1} if isinstance(vocab, int) and not isinstance(vocab, bool) else {}


def skipped_key(key: str) -> str | None:
    """The release's sampling-interval buffers (training's variance search) are not weights."""
    return "schedule" if key in ("sampling_eps_min", "sampling_eps_max") else None


class LayerNorm(nn.Module):
    """LayerNorm without bias, in float32, then times the weight."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.dim = dim

    def forward(self, x):
        return (F.layer_norm(x.float(), [self.dim]) * self.weight[None, None, :]).to(x.dtype)


def _modulate(x, shift, scale):
    return x * (1 + scale) + shift


class Embedding(nn.Module):
    """The token table as the release names it (`embedding`, a bare parameter)."""

    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.embedding = nn.Parameter(torch.empty(vocab, dim))

    @property
    def weight(self):
        return self.embedding

    def forward(self, ids):
        return self.embedding[ids]


class TimestepEmbedder(nn.Module):
    def __init__(self, cond: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(FREQ_DIM, cond), nn.SiLU(), nn.Linear(cond, cond))

    def forward(self, t):
        half = FREQ_DIM // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(0, half, dtype=torch.float32, device=t.device) / half)
        args = t[:, None].float() * freqs[None]
        return self.mlp(torch.cat([torch.cos(args), torch.sin(args)], dim=-1))


class DiTBlock(nn.Module):
    def __init__(self, c: ArchConfig) -> None:
        super().__init__()
        d, lay = c.hidden_size, c.layout
        self.norm1 = LayerNorm(d)
        self.attn_qkv = nn.Linear(d, 3 * d, bias=False)
        self.attn_out = nn.Linear(d, d, bias=False)
        self.norm2 = LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, c.intermediate_size), nn.GELU(approximate="tanh"),
                                 nn.Linear(c.intermediate_size, d))
        if lay.adaln:
            self.adaLN_modulation = nn.Linear(lay.cond_dim, 6 * d)
        self.heads = c.num_heads

    def forward(self, x, rope, kv, layer, kv_start, mask, cond):
        if cond is not None:
            shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = self.adaLN_modulation(cond)[:, None].chunk(6, dim=2)
            h = _modulate(self.norm1(x), shift_a, scale_a)
        else:
            h = self.norm1(x)
        a = fused_self_attention(h, self.attn_qkv, self.attn_out, self.heads, self.heads, rope, kv, layer, kv_start,
                                 mask)
        if cond is None:
            x = x + a
            return x + self.mlp(self.norm2(x))
        x = x + gate_a * a
        return x + gate_m * self.mlp(_modulate(self.norm2(x), shift_m, scale_m))


class FinalLayer(nn.Module):
    def __init__(self, c: ArchConfig) -> None:
        super().__init__()
        self.norm_final = LayerNorm(c.hidden_size)
        self.linear = nn.Linear(c.hidden_size, c.vocab_size)
        if c.layout.adaln:
            self.adaLN_modulation = nn.Linear(c.layout.cond_dim, 2 * c.hidden_size)

    def forward(self, x, cond):
        if cond is None:
            return self.linear(self.norm_final(x))
        shift, scale = self.adaLN_modulation(cond)[:, None].chunk(2, dim=2)
        return self.linear(_modulate(self.norm_final(x), shift, scale))


class _Backbone(nn.Module):
    def __init__(self, c: ArchConfig) -> None:
        super().__init__()
        self.vocab_embed = Embedding(c.vocab_size, c.hidden_size)
        if c.layout.adaln:
            self.sigma_map = TimestepEmbedder(c.layout.cond_dim)
        self.blocks = nn.ModuleList(DiTBlock(c) for _ in range(c.num_layers))
        self.output_layer = FinalLayer(c)


class DiTModel(DiffusionLM):
    """MDLM / BD3-LM's DiT; the last vocabulary id is the mask, never proposed."""

    tp_plan = {}

    def __init__(self, config: ArchConfig) -> None:
        super().__init__()
        self.config = config
        self.backbone = _Backbone(config)
        self.rope = RotaryEmbedding(config.head_dim, config.rope_theta)

    def parts(self):
        b = self.backbone
        return b.vocab_embed, b.blocks, b.output_layer.norm_final, b.output_layer.linear

    def forward(self, input_ids, positions, kv=None, kv_start=0, key_mask=None, logits_slice=None, attn_mask=None,
                vocab_local=False, capture=None):
        if capture is not None:
            raise ValueError("the MDLM / BD3-LM DiT exposes no layer features (DFlash drafting)")
        b = self.backbone
        x = b.vocab_embed(input_ids)
        cond = None
        if self.config.layout.adaln:  # sigma = 0 (no time conditioning), one row per sequence as the release runs
            cond = F.silu(b.sigma_map(torch.zeros(x.shape[0], device=x.device)))
        rope = self.rope(positions)
        mask = self.attention_mask(input_ids, positions, kv, kv_start, key_mask, attn_mask)
        for i, block in enumerate(b.blocks):
            x = block(x, rope, kv, i, kv_start, mask, cond)
        logits = b.output_layer(select_positions(x, logits_slice), cond)
        logits[..., -1] = -torch.inf  # the mask token (subs parameterization)
        return logits

    def embed(self, ids):
        return self.backbone.vocab_embed(ids)

    def head(self, hidden):
        raise ValueError("the MDLM / BD3-LM DiT has no separate head (its final layer is conditioned)")
