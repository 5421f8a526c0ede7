"""DiffusionGemma's config.json read into an ArchConfig: the Gemma 4 text stack's layout (which
layers are sliding-window and which full attention, the full layers' own head size, key/value
heads and proportional rotary, the logit soft-cap) and its mixture of experts, every option the
release may set checked by name (unsupported ones refused, never ignored). The modules that run
it are models/diffusion_gemma.py."""

import math
from dataclasses import dataclass

from unmask.errors import CheckpointError
from unmask.layers.moe import MoEConfig
from unmask.models.base import ArchConfig, cfg_flag, cfg_float, cfg_int

FAMILY = "DiffusionGemma"


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
