"""Training a small renoising model (`unmask train --kind renoise`): DiffusionGemma's layout at the
embedded model's scale, on the task suite.

Objective (uniform-token corruption with self-conditioning): the causal encoder writes the
prompt into the KV cache; each answer position (end-of-text padding included: the canvas is the
whole answer, `gen_length` positions) is replaced by a uniformly random word with probability t,
t ~ U(eps, 1) stratified over the batch; the denoiser predicts the clean token at every canvas
position (cross-entropy, all positions: at inference every position is rewritten every step).
Self-conditioning as at inference: for a share `self_cond` of the rows, a first denoiser pass
without gradient gives logits that condition the second pass (the others get a zero signal, as a
canvas's first step does).

Layout: sliding-window layers whose window spans any sequence of the suite (so attention is full,
as in the masked model) and a last full-attention layer (the release forces it), a dense MLP of
`mlp` beside `experts` experts of `expert_size` (top `top_k`), tied embeddings, canvas
`gen_length`. `init_from` a LLaDA-layout model of the same width and depth (the embedded model)
copies what has a counterpart (embedding, attention projections but the last layer's values,
the MLP, the pre-norms): a warm start, not the same function (Gemma's extra norms, unscaled
attention and GELU change it, and the masked model predicts with a token shift, this one without).
"""

from pathlib import Path

import torch
import torch.nn.functional as F

from unmask.kv.renoise import RenoiseKV
from unmask.errors import UnmaskError
from unmask.models.base import TokenIds
from unmask.models.diffusion_gemma import DiffusionGemmaModel
from unmask.models.diffusion_gemma_config import diffusion_gemma_arch
from unmask.train.data import SPECIALS, Batch

WINDOW = 4096  # longer than any sequence of the task suite: the sliding layers attend fully


def config_json(cfg, vocab: int, ids: TokenIds) -> dict:
    """config.json in DiffusionGemma's released layout for this run's shape."""
    layers = cfg.layers
    head = cfg.d_model // cfg.heads
    text = {"model_type": "diffusion_gemma_text", "vocab_size": vocab, "hidden_size": cfg.d_model,
            "intermediate_size": cfg.mlp, "num_hidden_layers": layers, "num_attention_heads": cfg.heads,
            "num_key_value_heads": cfg.heads, "head_dim": head, "hidden_activation": "gelu_pytorch_tanh",
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
            "sliding_window": WINDOW, "layer_types": ["sliding_attention"] * (layers - 1) + ["full_attention"],
            "per_layer_config": {str(layers - 1): {"head_dim": head, "num_key_value_heads": cfg.heads}},
            "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 1.0,
                                                   "rope_theta": 10000.0}},
            "num_experts": cfg.experts, "top_k_experts": cfg.top_k, "moe_intermediate_size": cfg.expert_size,
            "use_bidirectional_attention": None, "attention_bias": False,
            "pad_token_id": ids.pad, "eos_token_id": ids.eos, "bos_token_id": ids.bos}
    return {"architectures": ["DiffusionGemmaForBlockDiffusion"], "model_type": "diffusion_gemma",
            "canvas_length": cfg.gen_length, "tie_word_embeddings": True, "text_config": text}


def build(cfg, vocab: int, ids: TokenIds) -> DiffusionGemmaModel:
    model = DiffusionGemmaModel(diffusion_gemma_arch(config_json(cfg, vocab, ids)))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0, 0.02) if p.dim() >= 2 else p.fill_(1.0)
    return model.train()


def init_from_llada(model: DiffusionGemmaModel, src) -> None:
    """Copy a LLaDA-layout model's weights where they have a counterpart (see the module doc)."""
    c, s = model.config, src.config
    if (s.hidden_size, s.num_layers, s.num_heads, s.vocab_size) != (c.hidden_size, c.num_layers, c.num_heads,
                                                                    c.vocab_size) or s.family != "llada":
        raise UnmaskError(f"--init-from: a LLaDA-layout model of hidden {c.hidden_size}, {c.num_layers} layers, "
                          f"{c.num_heads} heads and vocabulary {c.vocab_size} is needed (got {s.family}, hidden "
                          f"{s.hidden_size}, {s.num_layers} layers)")
    if s.intermediate_size != c.intermediate_size:
        raise UnmaskError(f"--init-from: its MLP is {s.intermediate_size} wide, this model's --mlp {c.intermediate_size}")
    t, d = src.model.transformer, model.model.decoder
    with torch.no_grad():
        d.embed_tokens.weight.copy_(t.wte.weight)
        for blk, layer in zip(t.blocks, d.layers):
            a = layer.self_attn
            a.q_proj.weight.copy_(blk.q_proj.weight)
            a.k_proj.weight.copy_(blk.k_proj.weight)
            if hasattr(a, "v_proj"):
                a.v_proj.weight.copy_(blk.v_proj.weight)
            a.o_proj.weight.copy_(blk.attn_out.weight)
            layer.mlp.gate_proj.weight.copy_(blk.ff_proj.weight)
            layer.mlp.up_proj.weight.copy_(blk.up_proj.weight)
            layer.mlp.down_proj.weight.copy_(blk.ff_out.weight)
            layer.input_layernorm.weight.copy_(blk.attn_norm.weight)
            layer.pre_feedforward_layernorm.weight.copy_(blk.ff_norm.weight)


def renoise_loss(model: DiffusionGemmaModel, b: Batch, t: torch.Tensor, self_cond: float,
                 gen: torch.Generator) -> torch.Tensor:
    """Sum over rows of the mean-free loss: cross-entropy of the clean token at every canvas
    position (divide by rows x canvas length for the mean)."""
    P, (B, n) = b.prompt_len, b.ids.shape
    G = n - P
    lay = model.config.layout
    kv = RenoiseKV(lay.sliding, lay.window, B, b.ids.device)
    prompt_pos = b.positions[:, :P]
    real = b.key_mask[:, :P] if b.key_mask is not None else torch.ones(B, P, dtype=torch.bool)
    with kv.writing(prompt_pos, torch.ones_like(real), real):
        model.encode(b.ids[:, :P], prompt_pos, kv)
    clean = b.ids[:, P:]
    corrupt = torch.rand(B, G, generator=gen) < t[:, None]
    first_word = len(SPECIALS)
    noise = torch.randint(first_word, model.config.vocab_size, (B, G), generator=gen)
    noisy = torch.where(corrupt, noise, clean)
    canvas_pos = b.positions[:, P:]
    sc_rows = torch.rand(B, generator=gen) < self_cond
    sc = None
    if bool(sc_rows.any()):
        with torch.no_grad():
            sc = model.denoise(noisy, canvas_pos, kv, None).detach()
    logits = model.denoise(noisy, canvas_pos, kv, sc, sc_rows if sc is not None else None)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), clean.reshape(-1), reduction="none")
    return ce.sum()


def save(model: DiffusionGemmaModel, tok, folder: Path, cfg, ids: TokenIds, meta: dict) -> None:
    """A checkpoint folder in DiffusionGemma's released layout."""
    from unmask.train.checkpoint import write_checkpoint

    gen = {"eos_token_id": ids.eos, "pad_token_id": ids.pad, "bos_token_id": ids.bos, "max_new_tokens": cfg.gen_length}
    write_checkpoint(folder, model, config_json(cfg, model.config.vocab_size, ids), gen, meta, tok)
