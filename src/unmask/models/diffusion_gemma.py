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


import torch
import torch.nn.functional as F
from torch import nn

from unmask.layers.moe import MoEConfig, mix_experts
from unmask.layers.rope import apply_rotary
from unmask.models.base import ArchConfig

_ENC = "model.encoder.language_model."
_VISION = ("model.encoder.vision_tower.", "model.encoder.embed_vision.")


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
