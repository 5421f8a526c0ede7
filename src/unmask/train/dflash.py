"""Training a DFlash drafter for an autoregressive target (`unmask train --kind dflash --target
default-ar`): SpecForge's objective (sgl-project/SpecForge `specforge/core/dflash.py`) on the task
suite, with the target frozen.

Data: each training prompt is answered by the target itself (greedy, through the request engine),
so the drafter learns to predict what the target will say, not the reference answer (what the
target accepts is its own output; SpecForge regenerates its data with the target for the same
reason). One forward of the target over prompt + its answer gives the features of every position
(the drafter's `target_layer_ids`, concatenated).

Objective: per row, up to `anchors` anchor positions are drawn without replacement among the
answer's tokens (the positions whose token is verified when a block is drafted: the first answer
token, from the prefill, up to the last token before end of text). Each anchor opens a block
`[anchor token, MASK x (B - 1)]` at positions anchor .. anchor + B - 1; all blocks of a row go in
one drafter forward, each seeing the target's features strictly before its anchor (the anchor's
own features do not exist yet at decoding) and itself, never another block (models.dflash's
`mask`). Block position k predicts the token at anchor + k (k >= 1; up to the answer's end of
text), cross-entropy weighted exp(-(k - 1) / gamma): a draft is accepted only as far as its first
miss, so early positions matter most. The loss is the weighted mean.

Layout written: the release's (`DFlashDraftModel`, model_type qwen3, `dflash_config`), which
unmask.models.loader.load_drafter reads and z-lab's own class loads.
"""

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from unmask.models.dflash import DFlashDrafter, DraftConfig
from unmask.train.data import Batch, group_batches
from unmask.train.checkpoint import write_checkpoint


def draft_config(cfg, target, mask_id: int) -> DraftConfig:
    """The drafter's shape: the target's width and heads (it shares the embedding and head),
    `cfg.layers` layers, `cfg.mlp`, blocks of `cfg.block_length`, reading `cfg.target_layers`."""
    a = target.config
    ids = tuple(cfg.target_layers) if cfg.target_layers else tuple(range(a.num_layers))
    return DraftConfig(a.hidden_size, cfg.layers, a.num_heads, a.num_kv_heads, a.head_dim, cfg.mlp, a.norm_eps,
                       a.rope_theta, False, cfg.block_length, a.num_layers, ids, mask_id)


def config_json(c: DraftConfig, vocab_size: int) -> dict:
    """config.json in the released layout (z-lab's drafters are Qwen3 configs with DFlash fields)."""
    return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "vocab_size": vocab_size,
            "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
            "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "hidden_act": "silu",
            "rms_norm_eps": c.norm_eps, "rope_theta": c.rope_theta, "attention_bias": c.attention_bias,
            "max_position_embeddings": 512, "tie_word_embeddings": False, "use_sliding_window": False,
            "layer_types": ["full_attention"] * c.num_layers, "block_size": c.block_size,
            "num_target_layers": c.num_target_layers,
            "dflash_config": {"target_layer_ids": list(c.target_layer_ids), "mask_token_id": c.mask_token_id}}


class DraftTrainee(nn.Module):
    """The drafter being trained beside its frozen target: parameters and state dict are the
    drafter's alone."""

    def __init__(self, drafter: DFlashDrafter, target) -> None:
        super().__init__()
        self.drafter = drafter
        object.__setattr__(self, "target", target.eval().requires_grad_(False))  # not a submodule

    @property
    def config(self):
        return self.drafter.config


def build(cfg, target, mask_id: int) -> DraftTrainee:
    drafter = DFlashDrafter(draft_config(cfg, target, mask_id))
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.02)
    return DraftTrainee(drafter.train(), target)


def regenerate(llm, examples, tok, gen_length: int) -> list[Batch]:
    """The examples' prompts answered by the target (greedy), as training batches."""
    from unmask.params import GenerationParams

    prompts = [tok.encode(ex.prompt).ids for ex in examples]
    out = llm.generate(prompts, GenerationParams(gen_length=gen_length, block_length=gen_length, steps=gen_length))
    return group_batches([(p, r.token_ids) for p, r in zip(prompts, out.results)], tok, gen_length)


def sample_anchors(b: Batch, count: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, N) anchor columns and (R, N) which are real: up to `count` distinct answer positions
    holding a token before end of text, drawn uniformly (a row with fewer fills the rest with
    unused entries)."""
    R, n = b.ids.shape
    P = b.prompt_len
    cols = torch.arange(n)[None, :]
    valid = (cols >= P) & (cols < P + b.answer_len[:, None])
    N = max(1, min(count, int(valid.sum(1).max())))
    order = torch.where(valid, torch.rand(R, n, generator=gen), 2.0).argsort(1)[:, :N]  # real ones first
    keep = torch.arange(N)[None, :] < valid.sum(1, keepdim=True)
    return torch.where(keep, order, P), keep


def dflash_loss(model: DraftTrainee, b: Batch, count: int, gamma: float, gen: torch.Generator):
    """(weighted cross-entropy summed, weights summed, accepted-style accuracy counts) for one batch."""
    drafter, target = model.drafter, model.target
    c = drafter.config
    B = c.block_size
    R, n = b.ids.shape
    with torch.no_grad():
        _, feats = target(b.ids, b.positions, key_mask=b.key_mask, logits_slice=slice(0, 1),
                          capture=tuple(c.target_layer_ids))
    anchors, keep = sample_anchors(b, count, gen)
    N = anchors.shape[1]
    k = torch.arange(B)
    label_cols = anchors[:, :, None] + k  # (R, N, B)
    in_range = label_cols <= (b.prompt_len + b.answer_len)[:, None, None]  # up to the end-of-text token
    safe = label_cols.clamp(max=n - 1)
    labels = b.ids.gather(1, safe.view(R, -1)).view(R, N, B)
    noise = torch.full((R, N, B), c.mask_token_id, dtype=torch.long)
    noise[:, :, 0] = b.ids.gather(1, anchors)
    pos = b.positions.gather(1, anchors)[:, :, None] + k
    # keys: the n context columns, then the N blocks; a block sees real context before its anchor, and itself
    ctx = torch.arange(n)[None, None, :] < anchors[:, :, None]  # (R, N, n)
    if b.key_mask is not None:
        ctx = ctx & b.key_mask[:, None, :]
    own = torch.eye(N, dtype=torch.bool)[None].expand(R, -1, -1)  # (R, N, N) block j sees block j
    mask = torch.cat([ctx.repeat_interleave(B, 1), own.repeat_interleave(B, 1).repeat_interleave(B, 2)], 2)
    hidden = drafter(target.embed(noise.view(R, -1)), feats, torch.cat([b.positions, pos.view(R, -1)], 1),
                     None, mask[:, None])
    logits = target.head(hidden[:, :].view(R, N, B, -1)[:, :, 1:])  # block position 0 is the anchor itself
    w = (keep[:, :, None] & in_range[:, :, 1:]).float() * torch.exp(-(k[1:] - 1).float() / gamma)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, :, 1:].reshape(-1), reduction="none")
    right = (logits.argmax(-1) == labels[:, :, 1:]) & keep[:, :, None] & in_range[:, :, 1:]
    # the run a draft would have accepted at each anchor (its leading correct predictions)
    run = (right | ~(keep[:, :, None] & in_range[:, :, 1:])).long().cumprod(-1) * (keep[:, :, None] & in_range[:, :, 1:])
    return (ce * w.reshape(-1)).sum(), w.sum(), run.sum().detach(), keep.sum().detach()


def save(model: DraftTrainee, tok, folder: Path, meta: dict, vocab_size: int) -> None:
    """The drafter in the released layout (plus the target's tokenizer files and training.json),
    written atomically."""
    write_checkpoint(folder, model.drafter, config_json(model.drafter.config, vocab_size), None, meta, tok)


@torch.inference_mode()
def evaluate(model: DraftTrainee, tok, tasks, n: int, gen_length: int, stop: tuple[int, ...]) -> dict:
    """On the first `n` held-out prompts of each task: mean tokens per target verify forward
    (accepted drafts + the bonus token), and the share of outputs equal to the target's greedy
    output (must be 1: verification is lossless)."""
    from unmask.reference.dflash import autoregressive, speculate
    from unmask.tasks import held_out

    drafter, target = model.drafter.eval(), model.target
    out = {}
    for task in tasks:
        acc, same = [], 0
        for ex in held_out(task, n):
            prompt = tok.encode(ex.prompt).ids
            s = speculate(target, drafter, prompt, gen_length, stop)
            same += s.tokens == autoregressive(target, prompt, gen_length, stop)
            acc += s.accepted
        out[task] = {"accepted": round(sum(acc) / max(1, len(acc)), 3), "lossless": same / n}
    model.drafter.train()
    return out
