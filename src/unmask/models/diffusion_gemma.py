"""DiffusionGemma (Google, 2026; model_type "diffusion_gemma", `DiffusionGemmaForBlockDiffusion`):
a renoising block-diffusion model on the Gemma 4 text stack, text only.

One stack of layer weights runs in two roles (the release ties them):
- the **encoder** (causal) writes the prompt, then each finished canvas, into a KV cache;
- the **denoiser** rewrites one canvas of `canvas_length` tokens, attending bidirectionally over
  the cache and the canvas, and never writes the cache. Its input is the canvas's embeddings
  plus a self-conditioning signal made from the previous step's logits.
Both return logits only; the sampler (entropy bound, renoising, stopping) is unmask.reference's
(`compat diffusion-gemma`).

The stack, as its config describes it: a pattern of sliding-window and full-attention layers (the
last is always full); full layers have their own head size and key/value heads, no value
projection (values are the key projection, normalised without a scale) and proportional partial
rotary (the first `partial_rotary_factor` of each half-head rotated, frequencies over the whole
head); sliding layers default rotary. Queries, keys and values are RMS-normalised per head and
attention is unscaled. Each layer: attention and a dense GELU-tanh MLP beside a mixture of experts
(a softmax router over the RMS-normalised residual times `scale / sqrt(hidden)`, top-k weights
renormalised then times `per_expert_scale`; experts packed as `gate_up_proj` (E, 2F, H) and
`down_proj` (E, H, F)), each with its pre and post norms, then `layer_scalar`. Embeddings are scaled
by sqrt(hidden) and tied to the head; logits are soft-capped (tanh(x / c) * c, c = 30).

Checkpoint layout (what transformers' save_pretrained writes): the shared weights under
`model.decoder.*`, the encoder's own `layer_scalar` buffers under
`model.encoder.language_model.layers.{i}`; copies of the shared weights under the encoder's names
and `lm_head.weight` are accepted as the tied duplicates they are; the vision tower is skipped
with one notice (image input is not supported).
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from unmask.errors import CheckpointError
from unmask.layers.moe import MoEConfig, mix_experts
from unmask.layers.rope import apply_rotary
from unmask.models.base import ArchConfig, cfg_flag, cfg_float, cfg_int

FAMILY = "DiffusionGemma"
_ENC = "model.encoder.language_model."
_VISION = ("model.encoder.vision_tower.", "model.encoder.embed_vision.")


@dataclass(frozen=True)
class GemmaLayout:
    """What the Gemma 4 stack adds to ArchConfig (per layer kind: sliding or full attention)."""

    sliding: tuple[bool, ...]  # per layer: True = sliding-window attention
    window: int  # sliding_window: a query sees the keys of the last `window` positions, itself included
    full_head_dim: int
    full_kv_heads: int
    full_theta: float
    full_rotary: float  # proportional rotary: share of each head's frequencies that rotate
    softcap: float  # final_logit_softcapping
    has_vision: bool  # the folder describes a vision tower (its weights are skipped)
    encoder_bidirectional: bool = False  # use_bidirectional_attention "all" (refused: not the release)

    def num_parameters(self, c: ArchConfig, embeddings: bool = True, active: bool = False) -> int:
        """Parameters of the shared stack (the encoder and the denoiser run the same weights), the
        self-conditioning block, and the tied embedding once; `active`: top_k experts per layer."""
        d, m = c.hidden_size, c.moe
        total = d + 3 * d * c.intermediate_size + d  # final norm, self-conditioning (its pre norm)
        for sliding in self.sliding:
            hd, kv = (c.head_dim, c.num_kv_heads) if sliding else (self.full_head_dim, self.full_kv_heads)
            total += 2 * d * c.num_heads * hd + d * kv * hd * (2 if sliding else 1) + 2 * hd  # q o, k (v), norms
            total += 7 * d + 3 * d * c.intermediate_size + d * m.num_experts + d + m.num_experts  # norms, MLP, router
            total += (m.top_k if active else m.num_experts) * 3 * d * m.expert_size
        return total + (c.vocab_size * d if embeddings else 0)


def diffusion_gemma_arch(cfg: dict) -> ArchConfig:
    tc = cfg.get("text_config")
    if not isinstance(tc, dict):
        raise CheckpointError("config.json: DiffusionGemma config lacks its text_config object")
    act = tc.get("hidden_activation", "gelu_pytorch_tanh")
    if act != "gelu_pytorch_tanh":
        raise CheckpointError(f"config.json: unsupported DiffusionGemma option text_config.hidden_activation={act!r} "
                              "(supported: 'gelu_pytorch_tanh')")
    bidir = tc.get("use_bidirectional_attention")
    if bidir not in (None, "vision"):
        raise CheckpointError(f"config.json: unsupported DiffusionGemma option text_config.use_bidirectional_attention="
                              f"{bidir!r} (supported: null, 'vision': a causal encoder over text)")
    if cfg_flag(tc, "attention_bias", False):
        raise CheckpointError("config.json: unsupported DiffusionGemma option text_config.attention_bias=true")
    if not cfg_flag(cfg, "tie_word_embeddings", True) or not cfg_flag(tc, "tie_word_embeddings", True):
        raise CheckpointError("config.json: DiffusionGemma ties its encoder, denoiser and head "
                              "(tie_word_embeddings false is not supported)")
    layers = cfg_int(tc, "num_hidden_layers", family=FAMILY)
    heads = cfg_int(tc, "num_attention_heads", family=FAMILY)
    kv_heads = cfg_int(tc, "num_key_value_heads", heads)
    hidden = cfg_int(tc, "hidden_size", family=FAMILY)
    head_dim = cfg_int(tc, "head_dim", 0) or hidden // heads
    sliding = _layer_types(tc, layers)
    full_hd, full_kv = _full_layer_shape(tc, sliding, head_dim, kv_heads)
    rope = tc.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise CheckpointError(f"config.json: text_config.rope_parameters {rope!r} must be an object")
    s_theta = _rope(rope, "sliding_attention", "default", 10_000.0)[0]
    f_theta, f_rotary = _rope(rope, "full_attention", "proportional", 1_000_000.0, 0.25)
    experts = _optional_int(tc, "num_experts")
    if not experts:
        raise CheckpointError("config.json: DiffusionGemma text_config lacks num_experts (its layers always hold "
                              "a mixture of experts)")
    moe = MoEConfig(num_experts=experts, top_k=cfg_int(tc, "top_k_experts", family=FAMILY),
                    expert_size=cfg_int(tc, "moe_intermediate_size", family=FAMILY), score="softmax")
    window = cfg_int(tc, "sliding_window", 512)
    if window < 2 and any(sliding):
        raise CheckpointError(f"config.json: text_config.sliding_window {window!r} must be at least 2")
    softcap = cfg_float(tc, "final_logit_softcapping", 30.0)  # a class constant of the release's config
    if not math.isfinite(softcap) or softcap <= 0:
        raise CheckpointError(f"config.json: final_logit_softcapping {softcap!r} must be a number > 0")
    canvas = cfg_int(cfg, "canvas_length", 256)
    if canvas < 1:
        raise CheckpointError(f"config.json: canvas_length {canvas!r} must be a positive integer")
    layout = GemmaLayout(sliding=sliding, window=window, full_head_dim=full_hd, full_kv_heads=full_kv,
                         full_theta=f_theta, full_rotary=f_rotary, softcap=softcap,
                         has_vision=isinstance(cfg.get("vision_config"), dict))
    if heads % full_kv:
        raise CheckpointError(f"config.json: {heads} attention heads are not a multiple of the full-attention "
                              f"layers' {full_kv} key/value heads")
    return ArchConfig(
        family="diffusion_gemma", vocab_size=cfg_int(tc, "vocab_size", family=FAMILY), hidden_size=hidden,
        num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
        intermediate_size=cfg_int(tc, "intermediate_size", family=FAMILY), rope_theta=s_theta,
        norm_eps=cfg_float(tc, "rms_norm_eps", 1e-6), max_positions=cfg_int(tc, "max_position_embeddings", 131_072),
        tie_embeddings=True, head_size=head_dim if head_dim * heads != hidden else 0, qk_norm=True, moe=moe,
        canvas_length=canvas, layout=layout,
    )


def _optional_int(cfg: dict, key: str) -> int | None:
    return None if cfg.get(key) is None else cfg_int(cfg, key)


def _layer_types(tc: dict, layers: int) -> tuple[bool, ...]:
    types = tc.get("layer_types")
    if types is None:  # Gemma 4's default: five sliding layers, then a full one
        types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers:
        raise CheckpointError(f"config.json: text_config.layer_types must list one type per layer ({layers})")
    bad = [t for t in types if t not in ("sliding_attention", "full_attention")]
    if bad:
        raise CheckpointError(f"config.json: unknown layer type {bad[0]!r} (sliding_attention, full_attention)")
    sliding = [t == "sliding_attention" for t in types]
    sliding[-1] = False  # the last layer is always full attention (transformers forces it too)
    return tuple(sliding)


def _full_layer_shape(tc: dict, sliding: tuple[bool, ...], head_dim: int, kv_heads: int) -> tuple[int, int]:
    """(head size, key/value heads) of the full-attention layers: per_layer_config as
    save_pretrained writes it, or global_head_dim / num_global_key_value_heads."""
    per = tc.get("per_layer_config")
    if per is None:
        return cfg_int(tc, "global_head_dim", 512), _optional_int(tc, "num_global_key_value_heads") or kv_heads
    if not isinstance(per, dict):
        raise CheckpointError(f"config.json: text_config.per_layer_config {per!r} must be an object")
    shapes = set()
    for i, is_sliding in enumerate(sliding):
        entry = per.get(str(i), per.get(i))
        if entry is not None and (not isinstance(entry, dict) or set(entry) - {"head_dim", "num_key_value_heads"}):
            raise CheckpointError(f"config.json: per_layer_config[{i}] {entry!r}: only head_dim and "
                                  "num_key_value_heads are supported")
        if is_sliding:
            if entry:
                raise CheckpointError(f"config.json: per_layer_config[{i}] overrides a sliding layer (not supported)")
            continue
        entry = entry or {}
        shapes.add((cfg_int(entry, "head_dim", head_dim), cfg_int(entry, "num_key_value_heads", kv_heads)))
    if len(shapes) > 1:
        raise CheckpointError(f"config.json: full-attention layers of different shapes {sorted(shapes)}")
    return shapes.pop() if shapes else (head_dim, kv_heads)


def _rope(rope: dict, kind: str, rope_type: str, theta: float, rotary: float = 1.0) -> tuple[float, float]:
    r = rope.get(kind) or {"rope_type": rope_type}
    if not isinstance(r, dict) or r.get("rope_type", rope_type) != rope_type:
        raise CheckpointError(f"config.json: rope_parameters[{kind!r}] {r!r}: unmask supports rope_type "
                              f"{rope_type!r} there")
    extra = set(r) - {"rope_type", "rope_theta", "partial_rotary_factor", "factor"}
    if extra or r.get("factor", 1.0) != 1.0:
        raise CheckpointError(f"config.json: unsupported rope_parameters[{kind!r}] options {sorted(extra) or 'factor'}")
    factor = cfg_float(r, "partial_rotary_factor", rotary)
    if not 0 < factor <= 1 or (rope_type == "default" and factor != 1.0):
        raise CheckpointError(f"config.json: rope_parameters[{kind!r}] partial_rotary_factor {factor!r} unsupported")
    return cfg_float(r, "rope_theta", theta), factor


def skipped_key(key: str) -> str | None:
    """Why a checkpoint tensor is not loaded, or None if it must be (the loader's hook)."""
    if key.startswith(_VISION):
        return "vision"
    if key == "lm_head.weight" or (key.startswith(_ENC) and not key.endswith("layer_scalar")):
        return "tied"
    return None


class Norm(nn.Module):
    """Gemma 4's RMSNorm: x * (mean(x^2) + eps)^-0.5 in float32, times the weight (no 1 + w)."""

    def __init__(self, dim: int, eps: float, scale: bool = True) -> None:
        super().__init__()
        self.eps = eps
        if scale:
            self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        if hasattr(self, "weight"):
            h = h * self.weight.float()
        return h.type_as(x)


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class _MLP(nn.Module):
    def __init__(self, hidden: int, size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, size, bias=False)
        self.up_proj = nn.Linear(hidden, size, bias=False)
        self.down_proj = nn.Linear(size, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(_gelu(self.gate_proj(x)) * self.up_proj(x))


class _Router(nn.Module):
    def __init__(self, hidden: int, m: MoEConfig, eps: float) -> None:
        super().__init__()
        self.m = m
        self.norm = Norm(hidden, eps, scale=False)
        self.proj = nn.Linear(hidden, m.num_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(hidden))
        self.per_expert_scale = nn.Parameter(torch.ones(m.num_experts))

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h (T, H) -> (expert ids (T, k), weights (T, k))."""
        x = self.norm(h) * self.scale * h.shape[-1] ** -0.5
        probs = torch.softmax(self.proj(x), dim=-1, dtype=torch.float32)
        w, idx = torch.topk(probs, self.m.top_k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        return idx, w * self.per_expert_scale[idx]


class _Experts(nn.Module):
    expert_weights = ("gate_up_proj", "down_proj")  # stacked (E, out, in): what int8 quantization replaces

    def __init__(self, hidden: int, m: MoEConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(m.num_experts, 2 * m.expert_size, hidden))
        self.down_proj = nn.Parameter(torch.empty(m.num_experts, hidden, m.expert_size))

    first: int | None = None  # expert parallel: this rank's experts start here

    def checkpoint_parts(self) -> dict:
        """Checkpoint key -> (stacked weight, expert, part): each tensor holds every expert (None)."""
        return {"gate_up_proj": ("gate_up_proj", None, 0), "down_proj": ("down_proj", None, 0)}

    def forward(self, x, idx, w):
        return mix_experts(x, idx, w.to(x.dtype), self.gate_up_proj, self.down_proj, _gelu, self.first)


class _Attention(nn.Module):
    def __init__(self, c: ArchConfig, sliding: bool) -> None:
        super().__init__()
        lay = c.layout
        hd, kv = (c.head_dim, c.num_kv_heads) if sliding else (lay.full_head_dim, lay.full_kv_heads)
        self.heads, self.kv_heads, self.head_dim = c.num_heads, kv, hd
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, kv * hd, bias=False)
        if sliding:  # full layers take their values from the key projection
            self.v_proj = nn.Linear(c.hidden_size, kv * hd, bias=False)
        self.o_proj = nn.Linear(c.num_heads * hd, c.hidden_size, bias=False)
        self.q_norm = Norm(hd, c.norm_eps)
        self.k_norm = Norm(hd, c.norm_eps)
        self.v_norm = Norm(hd, c.norm_eps, scale=False)

    def qkv(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """x (B, n, H) -> q (B, heads, n, D), k, v (B, kv_heads, n, D); q and k rotated."""
        b, n, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, n, self.heads, self.head_dim))
        k_raw = self.k_proj(x).view(b, n, self.kv_heads, self.head_dim)
        v = self.v_norm(self.v_proj(x).view(b, n, self.kv_heads, self.head_dim) if hasattr(self, "v_proj") else k_raw)
        k = self.k_norm(k_raw)
        cos, sin = rope
        q = apply_rotary(q.transpose(1, 2), cos, sin)
        k = apply_rotary(k.transpose(1, 2), cos, sin)
        return q, k, v.transpose(1, 2)

    def out(self, q, k, v, mask) -> torch.Tensor:
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0, enable_gqa=q.shape[1] != k.shape[1])
        b, h, n, d = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(b, n, h * d))


class _Layer(nn.Module):
    def __init__(self, c: ArchConfig, i: int) -> None:
        super().__init__()
        d, eps = c.hidden_size, c.norm_eps
        self.sliding = c.layout.sliding[i]
        self.self_attn = _Attention(c, self.sliding)
        self.mlp = _MLP(d, c.intermediate_size)
        self.router = _Router(d, c.moe, eps)
        self.experts = _Experts(d, c.moe)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
                     "pre_feedforward_layernorm_2"):
            setattr(self, name, Norm(d, eps))
        self.register_buffer("layer_scalar", torch.ones(1))

    def forward(self, x, rope, attend, scalar):
        """`attend(q, k, v)` -> attention output heads: the role (encoder or denoiser) decides
        which keys the queries see. `scalar`: the role's layer_scalar."""
        h = self.post_attention_layernorm(attend(self.self_attn, self.input_layernorm(x), rope))
        x = x + h
        flat = x.reshape(-1, x.shape[-1])
        dense = self.post_feedforward_layernorm_1(self.mlp(self.pre_feedforward_layernorm(x)))
        idx, w = self.router(flat)
        sparse = self.experts(self.pre_feedforward_layernorm_2(flat), idx, w).view(x.shape)
        x = x + self.post_feedforward_layernorm(dense + self.post_feedforward_layernorm_2(sparse))
        return x * scalar


class _SelfConditioning(nn.Module):
    def __init__(self, c: ArchConfig) -> None:
        super().__init__()
        self.pre_norm = Norm(c.hidden_size, c.norm_eps)
        self.post_norm = Norm(c.hidden_size, c.norm_eps, scale=False)
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, embeds, soft):
        h = self.pre_norm(soft)
        return self.post_norm(embeds + self.down_proj(_gelu(self.gate_proj(h)) * self.up_proj(h)))


class _Decoder(nn.Module):
    def __init__(self, c: ArchConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(_Layer(c, i) for i in range(c.num_layers))
        self.norm = Norm(c.hidden_size, c.norm_eps)
        self.self_conditioning = _SelfConditioning(c)


class _Scalar(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("layer_scalar", torch.ones(1))


class _EncoderText(nn.Module):
    def __init__(self, c: ArchConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Scalar() for _ in range(c.num_layers))


class _Encoder(nn.Module):
    def __init__(self, c: ArchConfig) -> None:
        super().__init__()
        self.language_model = _EncoderText(c)


class _Inner(nn.Module):
    def __init__(self, c: ArchConfig) -> None:
        super().__init__()
        self.encoder = _Encoder(c)
        self.decoder = _Decoder(c)


class DiffusionGemmaModel(nn.Module):
    """`encode` writes tokens into the encoder's KV cache; `denoise` returns a canvas's logits. No
    `forward`: the masked-diffusion interface does not apply to a renoising model. The KV cache
    is the caller's (unmask.kv.renoise): the model asks it, per layer, for the keys,
    values and mask to attend over."""

    tp_plan = {
        r"model\.decoder\.layers\.\d+\.self_attn\.q_proj": "col",
        r"model\.decoder\.layers\.\d+\.self_attn\.(k_proj|v_proj)": "kv",
        r"model\.decoder\.layers\.\d+\.self_attn\.o_proj": "row",
        r"model\.decoder\.(layers\.\d+\.mlp|self_conditioning)\.(gate_proj|up_proj)": "col",
        r"model\.decoder\.(layers\.\d+\.mlp|self_conditioning)\.down_proj": "row",
        r"model\.decoder\.layers\.\d+\.experts": "experts",
        r"model\.decoder\.embed_tokens": "vocab",
    }
    tp = None

    def __init__(self, config: ArchConfig) -> None:
        super().__init__()
        self.config = config
        self.model = _Inner(config)
        lay = config.layout
        self._inv_freq = {True: _inv_freq(config.head_dim, config.rope_theta, 1.0),
                          False: _inv_freq(lay.full_head_dim, lay.full_theta, lay.full_rotary)}

    def _ropes(self, positions: torch.Tensor, dtype) -> dict:
        """positions (B, n) -> {sliding: (cos, sin)} each (B, 1, n, D), as the reference computes them."""
        out = {}
        for kind, inv in self._inv_freq.items():
            freqs = positions.float()[..., None] * inv.to(positions.device)
            table = torch.cat((freqs, freqs), dim=-1)
            out[kind] = (table.cos().to(dtype)[:, None], table.sin().to(dtype)[:, None])
        return out

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        e = self.model.decoder.embed_tokens
        return e(ids) * torch.tensor(self.config.hidden_size ** 0.5, dtype=e.weight.dtype)

    def encode(self, ids: torch.Tensor, positions: torch.Tensor, kv) -> None:
        """Write ids (B, n) at positions (B, n) into `kv` (unmask.kv.renoise.RenoiseKV, in
        its `writing` context), causally: each layer asks kv.encoder_keys for the keys and mask."""
        dec, enc = self.model.decoder, self.model.encoder.language_model
        ropes = self._ropes(positions, dec.embed_tokens.weight.dtype)
        x = self.embed(ids)
        for i, layer in enumerate(dec.layers):
            def attend(attn, h, rope, i=i):
                q, k, v = attn.qkv(h, rope)
                return attn.out(q, *kv.encoder_keys(i, k, v))

            x = layer(x, ropes[layer.sliding], attend, enc.layers[i].layer_scalar)

    def denoise(self, canvas: torch.Tensor, positions: torch.Tensor, kv, sc_logits: torch.Tensor | None,
                sc_rows: torch.Tensor | None = None) -> torch.Tensor:
        """canvas (B, L) at positions (B, L) after each row's slots -> logits (B, L, V) float32,
        soft-capped. `sc_logits` (B, L, V): the previous step's processed logits, the
        self-conditioning signal; None: a zero signal (a canvas's first step); `sc_rows` (B,) bool:
        the rows that have one (the others get zero, as the reference's self_conditioning_mask)."""
        dec = self.model.decoder
        wt = dec.embed_tokens.weight
        x = self.embed(canvas)
        if sc_logits is None:
            soft = torch.zeros_like(x)
        else:
            probs = sc_logits.softmax(-1, dtype=torch.float32).to(wt.dtype)
            if self.tp is not None:  # this rank's vocabulary rows; the all-reduce adds the others
                lo, hi = self.tp.vocab_range(self.config.vocab_size)
                soft = self.tp.all_reduce(probs[..., lo:hi] @ wt)
            else:
                soft = probs @ wt
            soft = soft * torch.tensor(self.config.hidden_size ** 0.5, dtype=wt.dtype)
            if sc_rows is not None:
                soft = soft * sc_rows.to(soft.dtype)[:, None, None]
        x = dec.self_conditioning(x, soft)
        ropes = self._ropes(positions, wt.dtype)
        for i, layer in enumerate(dec.layers):
            def attend(attn, h, rope, i=i):
                q, k, v = attn.qkv(h, rope)
                return attn.out(q, *kv.denoiser_keys(i, k, v))

            x = layer(x, ropes[layer.sliding], attend, layer.layer_scalar)
        logits = F.linear(dec.norm(x), wt).float()
        if self.tp is not None:
            logits = self.tp.gather_vocab(logits, self.config.vocab_size)
        cap = self.config.layout.softcap
        return torch.tanh(logits / cap) * cap


def _inv_freq(head_dim: int, theta: float, rotary: float) -> torch.Tensor:
    """Rotary frequencies over a whole head; proportional partial rotary sets the rest to 0
    (those dims are not rotated), as transformers' `proportional` rope computes them."""
    angles = int(rotary * head_dim // 2)
    rotated = 1.0 / (theta ** (torch.arange(0, 2 * angles, 2, dtype=torch.int64, device="cpu").float() / head_dim))
    return torch.cat([rotated, torch.zeros(head_dim // 2 - angles, device="cpu")])
