"""What every model family exposes to the engine: a config, a forward that returns logits."""

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from unmask.errors import CheckpointError
from unmask.layers.attention import KVBuffer
from unmask.layers.moe import MoEConfig
from unmask.layers.rope import RotaryEmbedding


@dataclass(frozen=True)
class ArchConfig:
    """Architecture facts the engine needs, normalised across families."""

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    rope_theta: float
    norm_eps: float
    max_positions: int
    tie_embeddings: bool = False
    qkv_bias: bool = False
    # logits at hidden position j predict the token at j + logit_shift (Dream: 1, LLaDA: 0)
    logit_shift: int = 0
    # causal attention: unmask's autoregressive twin models (an extension of the LLaDA layout)
    causal: bool = False
    # block diffusion (config.json `bd_size`): 0 = bidirectional over the whole sequence; B >= 1:
    # the query at position p attends to the key at position k iff k // B <= p // B (blocks of B
    # positions from position 0, bidirectional inside a block, never a later block)
    block_size: int = 0
    # per-head size when it is not hidden_size / num_heads (Qwen3, SDAR: config head_dim); 0 = derived
    head_size: int = 0
    # RMSNorm of each head's queries and keys before RoPE (Qwen3, SDAR: q_norm / k_norm)
    qk_norm: bool = False
    # rotated dims of each head (partial rotary, LLaDA2.x partial_rotary_factor); 0 = the whole head
    rotary_dim: int = 0
    # bias on the attention output projection (LLaDA2.x use_bias)
    attn_out_bias: bool = False
    # mixture-of-experts feed-forward (LLaDA2.x, LLaDA-MoE); None = dense
    moe: MoEConfig | None = None
    # a renoising model's canvas (DiffusionGemma: a canvas of random tokens that its own sampler
    # rewrites; it has no mask token and no `forward` for the masked-diffusion engine); 0 = not one
    canvas_length: int = 0
    # family-specific layout facts the family's model reads (DiffusionGemma: GemmaLayout); None elsewhere
    layout: object = None

    def __post_init__(self) -> None:
        """A config that cannot describe a working model is refused by name."""
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
                     "max_positions"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise CheckpointError(f"config.json: {name} {v!r} must be a positive integer")
        for name in ("rope_theta", "norm_eps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                raise CheckpointError(f"config.json: {name} {v!r} must be a finite number > 0")
            object.__setattr__(self, name, float(v))
        if not isinstance(self.block_size, int) or isinstance(self.block_size, bool) or self.block_size < 0:
            raise CheckpointError(f"config.json: bd_size {self.block_size!r} must be a positive integer")
        if self.block_size and self.causal:
            raise CheckpointError("config.json: a model is either causal or a block-diffusion model (bd_size), not both")
        if not isinstance(self.head_size, int) or isinstance(self.head_size, bool) or self.head_size < 0:
            raise CheckpointError(f"config.json: head_dim {self.head_size!r} must be a positive integer")
        if not self.head_size and self.hidden_size % self.num_heads:
            raise CheckpointError(f"config.json: hidden size {self.hidden_size} is not a multiple of the "
                                  f"{self.num_heads} attention heads")
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(f"config.json: {self.num_heads} attention heads are not a multiple of the "
                                  f"{self.num_kv_heads} key/value heads")
        if self.head_dim % 2:
            raise CheckpointError(f"config.json: head size {self.head_dim} must be even for rotary embeddings")
        if (not isinstance(self.rotary_dim, int) or isinstance(self.rotary_dim, bool) or self.rotary_dim < 0
                or self.rotary_dim > self.head_dim or self.rotary_dim % 2):
            raise CheckpointError(f"config.json: rotary dims {self.rotary_dim!r} must be an even number of at most "
                                  f"the head size {self.head_dim} (partial_rotary_factor)")

    @property
    def kind(self) -> str:
        """What the model is, for everything that treats kinds apart: "renoise" (a canvas of random
        tokens, DiffusionGemma), "causal" (the AR twin), "block" (block diffusion, bd_size) or "full"
        (full-attention masked diffusion)."""
        if self.canvas_length:
            return "renoise"
        return "causal" if self.causal else "block" if self.block_size else "full"

    @property
    def rope_dim(self) -> int:
        return self.rotary_dim or self.head_dim

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden_size // self.num_heads

    def num_parameters(self, embeddings: bool = True, active: bool = False) -> int:
        """Parameters in total, or (`active`) those one token reads: with experts, the router,
        its top_k routed experts and the shared experts of each MoE layer."""
        if hasattr(self.layout, "num_parameters"):  # a family whose layout ArchConfig does not describe
            return self.layout.num_parameters(self, embeddings, active)
        d, f, hd = self.hidden_size, self.intermediate_size, self.head_dim
        attn = d * self.num_heads * hd * 2 + d * self.num_kv_heads * hd * 2
        per_layer = attn + 2 * d + (2 * hd if self.qk_norm else 0)
        total = self.num_layers * per_layer + d
        m = self.moe
        moe_layers = m.layers_moe(self.num_layers) if m else 0
        total += (self.num_layers - moe_layers) * 3 * d * f
        if m:
            routed = m.top_k if active else m.num_experts
            total += moe_layers * (m.num_experts * d + routed * 3 * d * m.expert_size + 3 * d * m.shared_size)
        if embeddings:
            total += self.vocab_size * d * (1 if self.tie_embeddings else 2)
        return total


_REQUIRED = object()


def cfg_int(cfg: dict, key: str, default=_REQUIRED, family: str = "") -> int:
    """An integer field of config.json (a JSON number with no fraction), or a CheckpointError."""
    v = _get(cfg, key, default, family)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool):
        raise CheckpointError(f"config.json: {key} {v!r} must be an integer")
    return v


def cfg_float(cfg: dict, key: str, default=_REQUIRED, family: str = "") -> float:
    v = _get(cfg, key, default, family)
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise CheckpointError(f"config.json: {key} {v!r} must be a number")
    return float(v)


def cfg_flag(cfg: dict, key: str, default: bool) -> bool:
    """A true/false field of config.json (absent or null: `default`), or a CheckpointError."""
    v = cfg.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise CheckpointError(f"config.json: {key} {v!r} must be true or false")
    return v


def _get(cfg: dict, key: str, default, family: str):
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if default is _REQUIRED:
        raise CheckpointError(f"config.json: {family + ' ' if family else ''}config lacks required field {key!r}")
    return default


@dataclass(frozen=True)
class TokenIds:
    """Special token ids, read from the checkpoint's config and tokenizer files."""

    mask: int | None  # None: a model without a mask token (a renoising model)
    eos: int
    pad: int | None = None
    bos: int | None = None
    # every id that ends a generation (EOS, end-of-turn, ...); EOS is always included
    stop: tuple[int, ...] = field(default=())
    # fill-in-the-middle markers (prefix, suffix, middle) when the tokenizer has them: an
    # autoregressive model trained prefix-suffix-middle infills through them (inputs.layout)
    fim: tuple[int, int, int] | None = None
    # DreamOn's expand token, when the model has one: a mask whose prediction it is becomes two
    # masks (a hole of hole_length "grow" lengthens itself)
    expand: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(sorted(set(self.stop) | {self.eos})))


class DiffusionLM(nn.Module):
    """Base class: a transformer that maps token ids to logits; bidirectional for diffusion models,
    causal when `config.causal` (the autoregressive twin).

    forward(input_ids (B, q), positions (B, q), kv, kv_start (int, or (B,) per row), key_mask (B, Lk), logits_slice)
      -> logits (B, n, V) for the hidden positions selected by `logits_slice`: a slice shared by
      all rows, a (B, n) tensor of positions per row, or None for all q.
    Models know nothing about commit policies or cache policies; `kv` is a KVBuffer or None.
    A block-diffusion model (`config.block_size`) masks attention by blocks of positions; with a
    KV buffer, key column c holds position c (the engine's right-padded canvas).
    A family declares its parameters (named as its checkpoints name them) and `parts()`.
    """

    config: ArchConfig
    rope: RotaryEmbedding
    # tensor parallel (unmask.models.parallel): module-name pattern -> style, and this rank's group
    tp_plan: dict[str, str] = {}
    tp = None

    def parts(self) -> tuple[nn.Embedding, nn.ModuleList, nn.Module, nn.Linear | None]:
        """(token embedding, blocks, final norm, output head or None when tied to the embedding)."""
        raise NotImplementedError

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv: KVBuffer | None = None,
        kv_start: int = 0,
        key_mask: torch.Tensor | None = None,
        logits_slice: slice | None = None,
        attn_mask: torch.Tensor | None = None,
        vocab_local: bool = False,
        capture: tuple[int, ...] | None = None,
    ) -> torch.Tensor:
        """`attn_mask` (B, 1, q, Lk), True = attend, replaces the model's own attention rule and
        `key_mask` (the block-diffusion training objective attends across two copies of a sequence).
        A tensor-parallel model returns whole logits, or with `vocab_local` this rank's vocabulary
        slice (its sampler reduces over the slices: unmask.sampler.proposal). With `capture` (layer
        indices) it returns (logits, the outputs of those layers concatenated, (B, q, n * d), at
        every query position): the features a DFlash drafter reads."""
        embed, blocks, norm, head = self.parts()
        x = embed(input_ids)
        rope = self.rope(positions)
        mask = self.attention_mask(input_ids, positions, kv, kv_start, key_mask, attn_mask)
        feats = []
        for i, block in enumerate(blocks):
            x = block(x, rope, kv, i, kv_start, mask)
            if capture is not None and i in capture:
                feats.append(x)
        x = norm(select_positions(x, logits_slice))
        logits = x @ embed.weight.T if head is None else head(x)
        if self.tp is not None and not vocab_local:
            logits = self.tp.gather_vocab(logits, self.config.vocab_size)
        if capture is not None:
            return logits, torch.cat([feats[sorted(capture).index(i)] for i in capture], dim=-1)
        return logits

    def attention_mask(self, input_ids, positions, kv, kv_start, key_mask, attn_mask) -> torch.Tensor | None:
        """The attention rule of a forward: `attn_mask` when given, else the padding mask combined
        with the model's own rule (causal, block-diffusion blocks, or none)."""
        if attn_mask is not None:
            return attn_mask
        mask = None if key_mask is None else key_mask[:, None, None, :]
        if self.config.causal:
            return _with_causal(mask, input_ids.shape[1], kv, kv_start, input_ids.device)
        if self.config.block_size:
            return _with_blocks(mask, positions, kv, self.config.block_size)
        return mask

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings (a drafter embeds its noise block with its target's)."""
        return self.parts()[0](ids)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of hidden states (a drafter's, through its target's head)."""
        embed, _, _, head = self.parts()
        return hidden @ embed.weight.T if head is None else head(hidden)


def select_positions(x: torch.Tensor, logits_slice) -> torch.Tensor:
    """The hidden states that need the vocabulary projection: a slice shared by all rows, a (B, n)
    tensor of positions per row, or None for all (only positions that can commit need it)."""
    if isinstance(logits_slice, torch.Tensor):
        return x.gather(1, logits_slice[..., None].expand(-1, -1, x.shape[-1]))
    return x if logits_slice is None else x[:, logits_slice]


def _with_causal(mask, q: int, kv: KVBuffer | None, kv_start, device) -> torch.Tensor:
    """Combine a (B, 1, 1, Lk) padding mask with "key column <= query column". `kv_start` is the
    canvas column of the first query: one int for every row, or a (B,) tensor, one per row."""
    keys = kv.length if kv is not None else q
    cols = torch.arange(q, device=device)
    if isinstance(kv_start, torch.Tensor):
        first = kv_start if kv is not None else torch.zeros_like(kv_start)
        causal = (torch.arange(keys, device=device)[None, None, :] <= (first[:, None] + cols[None, :])[..., None])[:, None]
    else:
        offset = kv_start if kv is not None else 0
        causal = (torch.arange(keys, device=device)[None, :] <= (offset + cols)[:, None])[None, None]
    return causal if mask is None else mask & causal


def _with_blocks(mask, positions: torch.Tensor, kv: KVBuffer | None, size: int) -> torch.Tensor:
    """Combine a (B, 1, 1, Lk) padding mask with the block-diffusion rule "key block <= query
    block", blocks of `size` positions. Without a buffer the keys are the queries; with one, key
    column c is position c."""
    q_blk = positions // size  # (B, q)
    if kv is None:
        k_blk = q_blk[:, None, :]
    else:
        k_blk = (torch.arange(kv.length, device=positions.device) // size)[None, None, :]
    allowed = (k_blk <= q_blk[:, :, None])[:, None]  # (B, 1, q, Lk)
    return allowed if mask is None else mask & allowed
