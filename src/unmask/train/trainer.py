"""`unmask train`: masked-diffusion SFT (LLaDA objective), block diffusion, or the causal AR twin.

Diffusion objective (LLaDA SFT): the prompt is never masked; every answer position (end-of-text
padding included) is masked with probability t, t ~ U(eps, 1) drawn stratified across the batch;
the loss is cross-entropy on masked positions weighted by 1/t, divided by the answer canvas length.
AR objective: next-token cross-entropy on the answer and its first end-of-text token.
Block-diffusion objective (`block_loss`): BD3-LM / Fast-dLLM v2's vectorised form, with token shift.

Seeded and resumable: the run folder holds `trainer_state.pt` (model, optimizer, data and torch RNG
states) and `model/`, a checkpoint in the released LLaDA layout that loads through unmask's loader.
"""

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from unmask.models.base import ArchConfig, TokenIds
from unmask.models.llada import LLaDAModel
from unmask.tasks import TASKS
from unmask.train.checkpoint import write_checkpoint
from unmask.train.data import BOS, EOS, EXPAND, MASK, PAD, SPECIALS, Batch

DEFAULT_MIX = {t: 1.0 for t in TASKS}


@dataclass
class TrainConfig:
    kind: str = "diffusion"  # "diffusion" | "ar" | "block" | "renoise" | "dflash"
    layers: int = 4
    d_model: int = 256
    heads: int = 4
    mlp: int = 768
    gen_length: int = 32
    batch: int = 64
    steps: int = 3000
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    eps: float = 1e-3
    seed: int = 0
    tasks: dict = field(default_factory=lambda: dict(DEFAULT_MIX))
    eval_every: int = 250
    eval_n: int = 32
    init_from: str | None = None  # a run or model folder to start from (weights only)
    # diffusion only: 1 = logits at position j score token j + 1 (the AR alignment, as Dream kept
    # when it was adapted from Qwen); 0 = LLaDA's own alignment
    logit_shift: int = 0
    # block only: attention block of B positions (config.json bd_size); block models keep the AR
    # alignment (token shift, logit_shift 1)
    block_length: int = 8
    # block only: the token-to-token editing objective (LLaDA2.1's T2T): in each (row, block) a
    # share u ~ U(0, edit_noise) of the answer positions left visible in the noisy copy is replaced
    # by uniformly random non-special tokens, and every visible answer position is scored (predict
    # the clean token: keep a right one, repair a wrong one), weight `edit_weight`. 0 = off.
    edit_noise: float = 0.0
    edit_weight: float = 1.0
    # renoise only (unmask.train.renoise): DiffusionGemma's layout, its experts beside the dense
    # MLP, and the share of rows trained with a self-conditioning signal
    experts: int = 4
    top_k: int = 1
    expert_size: int = 32
    self_cond: float = 0.5
    # dflash only (unmask.train.dflash): a drafter for the autoregressive `target` (its width and
    # heads; `layers` and `mlp` are the drafter's, blocks of `block_length`), reading the target's
    # `target_layers` (empty: all), `anchors` blocks per row, loss decay `loss_gamma`
    target: str = "default-ar"
    target_layers: tuple = ()
    anchors: int = 16
    loss_gamma: float = 4.0
    # a code model (unmask.train.code): rows of `gen_length` tokens cut from a corpus instead of
    # the task suite: "stdlib" (the running CPython's standard library, which must be the pinned
    # version) or the folder of one; a byte-level BPE vocabulary of `vocab_size` tokens; diffusion
    # only: a share `span_rate` of rows masks one contiguous span instead of independent positions
    # (holes); ar only: a share `fim_rate` of rows is rewritten prefix-suffix-middle
    corpus: str | None = None
    vocab_size: int = 4096
    span_rate: float = 0.0
    # a hole's length the model decides: a span row is followed by 0..span_pad end-of-text tokens
    # inside its masked span (the rest of the row moves right), so that a model given more masks
    # than the middle needs writes the middle and ends it (unmask's hole_length "bound")
    span_pad: int = 0
    # DreamOn's expand token: a share `span_expand` of span rows is a hole of 1..64 tokens, each
    # hidden with probability (1 + t) / 2 (t: the row's noise level), neighbouring hidden tokens
    # joined at a per-row rate from U(0, 1): a position that stands for two or more tokens learns
    # <|expand|> (at inference it becomes two masks); a quarter of these holes are followed by
    # 1..span_pad hidden end-of-text tokens (deletions). The vocabulary gains <|expand|> (the last id).
    span_expand: float = 0.0
    fim_rate: float = 0.0

    def check(self) -> "TrainConfig":
        from unmask.errors import UnmaskError

        if self.kind not in ("diffusion", "ar", "block", "renoise", "dflash"):
            raise UnmaskError(f"unknown kind {self.kind!r}; choose diffusion, block, renoise, ar or dflash")
        self.target_layers = tuple(self.target_layers)
        if any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in self.target_layers):
            raise UnmaskError(f"target_layers {self.target_layers!r} must be layer indices")
        if self.kind == "dflash" and self.block_length < 2:
            raise UnmaskError(f"block_length {self.block_length} must be at least 2 for a drafter")
        if self.kind == "renoise" and self.logit_shift:
            raise UnmaskError("logit_shift 1: a renoising model scores each canvas position's own token")
        if not 0 <= self.self_cond <= 1 or self.top_k > self.experts:
            raise UnmaskError(f"self_cond {self.self_cond!r} must be in [0, 1] and top_k {self.top_k} at most "
                              f"experts {self.experts}")
        if self.kind == "block":
            self.logit_shift = 1  # token shift: the first token of a block is predicted by the last of the previous one
        for name in ("layers", "d_model", "heads", "mlp", "gen_length", "batch", "steps", "eval_every", "eval_n",
                     "block_length", "experts", "top_k", "expert_size", "anchors"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise UnmaskError(f"{name} {v!r} must be a positive integer")
        for name in ("warmup", "seed"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise UnmaskError(f"{name} {v!r} must be a non-negative integer")
        if not isinstance(self.tasks, dict) or not self.tasks:
            raise UnmaskError(f"tasks {self.tasks!r} must name at least one task with a weight")
        for task, w in self.tasks.items():
            if task not in TASKS:
                raise UnmaskError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not (math.isfinite(w) and w > 0):
                raise UnmaskError(f"task weight {w!r} for {task!r} must be a finite number > 0")
        if self.d_model % self.heads or (self.d_model // self.heads) % 2:
            raise UnmaskError(f"d_model {self.d_model} must split into {self.heads} heads of even size")
        if self.logit_shift not in (0, 1) or (self.logit_shift and self.kind == "ar"):
            raise UnmaskError(f"logit_shift {self.logit_shift!r} must be 0 or 1, and 1 only for a diffusion model")
        if not (isinstance(self.loss_gamma, (int, float)) and not isinstance(self.loss_gamma, bool)
                and math.isfinite(self.loss_gamma) and self.loss_gamma > 0):
            raise UnmaskError(f"loss_gamma {self.loss_gamma!r} must be a finite number > 0")
        for name in ("lr", "min_lr_ratio", "weight_decay", "grad_clip", "eps", "edit_noise", "edit_weight",
                     "span_rate", "fim_rate"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise UnmaskError(f"{name} {v!r} must be a finite number >= 0")
        if not self.lr > 0 or not 0 < self.eps < 1:
            raise UnmaskError(f"lr {self.lr} must be > 0 and eps {self.eps} in (0, 1)")
        if self.corpus is not None and self.kind not in ("diffusion", "ar"):
            raise UnmaskError(f"corpus {self.corpus!r}: a code model is a diffusion model or its ar twin, not {self.kind}")
        if self.span_rate > 1 or (self.span_rate and (self.kind != "diffusion" or self.corpus is None)):
            raise UnmaskError(f"span_rate {self.span_rate!r} must be in [0, 1], and above 0 only for a diffusion "
                              "code model (corpus)")
        if (not isinstance(self.span_pad, int) or isinstance(self.span_pad, bool) or self.span_pad < 0
                or (self.span_pad and not self.span_rate)):
            raise UnmaskError(f"span_pad {self.span_pad!r} must be a non-negative integer, and above 0 only with "
                              "span_rate")
        if (isinstance(self.span_expand, bool) or not isinstance(self.span_expand, (int, float))
                or not 0 <= self.span_expand <= 1 or (self.span_expand and not self.span_rate)):
            raise UnmaskError(f"span_expand {self.span_expand!r} must be in [0, 1], and above 0 only with span_rate")
        if self.fim_rate > 1 or (self.fim_rate and (self.kind != "ar" or self.corpus is None)):
            raise UnmaskError(f"fim_rate {self.fim_rate!r} must be in [0, 1], and above 0 only for an ar code model "
                              "(corpus)")
        if not isinstance(self.vocab_size, int) or isinstance(self.vocab_size, bool) or not 300 <= self.vocab_size <= 65536:
            raise UnmaskError(f"vocab_size {self.vocab_size!r} must be an integer in [300, 65536]")
        if self.edit_noise > 1 or (self.edit_noise and self.kind != "block"):
            raise UnmaskError(f"edit_noise {self.edit_noise!r} must be in [0, 1], and above 0 only for kind block")
        return self


def arch_for(cfg: TrainConfig, vocab_size: int) -> ArchConfig:
    return ArchConfig("llada", vocab_size, cfg.d_model, cfg.layers, cfg.heads, cfg.heads, cfg.mlp,
                      10000.0, 1e-5, 512, causal=cfg.kind == "ar", logit_shift=cfg.logit_shift,
                      block_size=cfg.block_length if cfg.kind == "block" else 0)


def llada_config_json(arch: ArchConfig, ids: TokenIds) -> dict:
    """config.json with the fields of the released LLaDA checkpoints."""
    cfg = {
        "architectures": ["LLaDAModelLM"], "model_type": "llada",
        "d_model": arch.hidden_size, "n_layers": arch.num_layers, "n_heads": arch.num_heads,
        "n_kv_heads": arch.num_kv_heads, "mlp_hidden_size": arch.intermediate_size,
        "mlp_ratio": max(1, arch.intermediate_size // arch.hidden_size),
        "vocab_size": arch.vocab_size, "embedding_size": arch.vocab_size,
        "max_sequence_length": arch.max_positions, "rope": True, "rope_theta": arch.rope_theta,
        "rope_full_precision": True, "rms_norm_eps": arch.norm_eps, "layer_norm_type": "rms",
        "block_type": "llama", "activation_type": "silu", "include_bias": False, "include_qkv_bias": False,
        "weight_tying": False, "alibi": False, "scale_logits": False, "block_group_size": 1,
        "mask_token_id": ids.mask, "eos_token_id": ids.eos, "pad_token_id": ids.pad, "bos_token_id": ids.bos,
        "use_cache": False, "precision": "fp32",
    }
    if arch.causal:
        cfg["causal"] = True  # unmask extension: the autoregressive twin
    if arch.logit_shift:
        cfg["logit_shift"] = arch.logit_shift  # unmask extension: AR alignment kept (Dream-style)
    if arch.block_size:
        cfg["bd_size"] = arch.block_size  # block diffusion, named as Fast-dLLM v2 names it
    if ids.expand is not None:
        cfg["expand_token_id"] = ids.expand  # unmask extension: DreamOn's expand token (holes that grow)
    return cfg


def token_ids(tok) -> TokenIds:
    eos = tok.token_to_id(EOS)
    return TokenIds(mask=tok.token_to_id(MASK), eos=eos, pad=tok.token_to_id(PAD), bos=tok.token_to_id(BOS), stop=(eos,),
                    expand=tok.token_to_id(EXPAND))


def save_model(model: LLaDAModel, tok, folder: Path, gen_defaults: dict, meta: dict) -> None:
    """Write a checkpoint folder in the released LLaDA layout."""
    ids = token_ids(tok)
    gen = {"eos_token_id": ids.eos, "pad_token_id": ids.pad, "bos_token_id": ids.bos, **gen_defaults}
    write_checkpoint(folder, model, llada_config_json(model.config, ids), gen, meta, tok)


def noise_levels(B: int, eps: float, gen: torch.Generator) -> torch.Tensor:
    """t ~ U(eps, 1) per row, stratified over the batch (evenly spread noise levels: lower-variance
    gradients), in random row order."""
    u = (torch.arange(B) + torch.rand(B, generator=gen)) / B
    return eps + (1 - eps) * u[torch.randperm(B, generator=gen)]


def diffusion_loss(model, b: Batch, mask_id: int, t: torch.Tensor, gen: torch.Generator,
                   span_rate: float = 0.0, span_pad: int = 0, eos_id: int | None = None,
                   span_expand: float = 0.0, expand_id: int | None = None, line_id: int | None = None) -> torch.Tensor:
    """Sum over rows of the LLaDA SFT loss: cross-entropy on masked answer positions weighted by 1/t
    (divide by rows x canvas length for the mean). With `span_rate`, that share of rows masks one
    contiguous span of round(t * G) positions (at least one) at a uniform offset instead; with
    `span_pad`, 0..span_pad end-of-text tokens follow the span inside it (the row's later tokens
    move right, the last ones leave the row); with `span_expand`, that share of span rows is
    DreamOn's canvas instead (`expand_span`)."""
    B, G = b.ids.shape[0], b.ids.shape[1] - b.prompt_len
    masked = torch.rand(B, G, generator=gen) < t[:, None]
    target_ids, key_mask = b.ids, b.key_mask
    if span_rate:
        span = torch.rand(B, generator=gen) < span_rate
        n = (t * G).round().long().clamp(1, G)
        start = (torch.rand(B, generator=gen) * (G - n + 1)).long()
        cols = torch.arange(G)[None, :]
        end = start + n
        if span_expand:
            squeeze = span & (torch.rand(B, generator=gen) < span_expand)
            # a squeezed hole: 1..64 tokens, mostly hidden (at inference it starts all masks, fewer than
            # its text), end-of-text padding (more masks than its text) on a quarter of them
            pad = (torch.rand(B, generator=gen) * (span_pad + 1)).long()
            pad = torch.where(squeeze, (1 + (torch.rand(B, generator=gen) * span_pad).long())
                              * (torch.rand(B, generator=gen) < 0.25), pad * span)
            if line_id is not None:  # whole lines of code
                at, to = line_span(b.ids[:, b.prompt_len :], line_id, gen)
            else:
                short = 1 + (torch.rand(B, generator=gen) * min(EXPAND_SPAN, G)).long()
                at = (torch.rand(B, generator=gen) * (G - short + 1)).long()
                to = at + short
            start, end = torch.where(squeeze, at, start), torch.where(squeeze, to, end)
            # half of them wholly hidden (as a hole is when its decode starts), the rest mostly
            t = torch.where(squeeze, torch.where(torch.rand(B, generator=gen) < 0.5, 1.0, 0.5 + 0.5 * t), t)
            region, hidden, valid = expand_span(b.ids[:, b.prompt_len :], start, end, pad, squeeze, t, eos_id,
                                                expand_id, gen)
            target_ids = torch.cat([b.ids[:, : b.prompt_len], region], 1)
            key_mask = torch.cat([torch.ones(B, b.prompt_len, dtype=torch.bool), valid], 1)
            if b.key_mask is not None:
                key_mask = key_mask & b.key_mask
            masked = torch.where(span[:, None], hidden, masked)
        elif span_pad:
            pad = (torch.rand(B, generator=gen) * (span_pad + 1)).long() * span  # span rows only
            src = torch.where(cols < end[:, None], cols, cols - pad[:, None]).clamp(min=0)
            region = b.ids[:, b.prompt_len :].gather(1, src)
            region = torch.where((cols >= end[:, None]) & (cols < (end + pad)[:, None]), eos_id, region)
            target_ids = torch.cat([b.ids[:, : b.prompt_len], region], 1)
            end = end + pad
        if not span_expand:
            masked = torch.where(span[:, None], (cols >= start[:, None]) & (cols < end[:, None]), masked)
    if key_mask is not None:
        masked = masked & key_mask[:, b.prompt_len :]
    ids = target_ids.clone()
    ids[:, b.prompt_len :][masked] = mask_id
    shift = model.config.logit_shift  # logits at j score token j + shift
    logits = model(ids, b.positions, key_mask=key_mask, logits_slice=slice(b.prompt_len - shift, ids.shape[1] - shift))
    target = target_ids[:, b.prompt_len :]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none").view(B, G)
    return ((ce * masked) / t[:, None]).sum()


EXPAND_SPAN = 64  # the longest squeezed span (a hole of a few lines)


def line_span(region: torch.Tensor, line_id: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A hole of whole lines in each row (DreamOn's "line" middles; `line_id`: the newline token,
    always a token of its own in the code models' vocabulary): 1-4 lines from a random line start,
    fewer when longer than EXPAND_SPAN tokens, the first EXPAND_SPAN tokens of one line when even
    it is. Returns (start, end) (B,)."""
    B, G = region.shape
    cols = torch.arange(G)[None, :]
    begins = torch.cat([torch.ones(B, 1, dtype=torch.bool), region[:, :-1] == line_id], 1)
    start = torch.where(begins, torch.rand(B, G, generator=gen), -1.0).argmax(1)
    after = begins & (cols > start[:, None])
    nth = after.long().cumsum(1)  # line starts after `start`, counted
    want = 1 + (torch.rand(B, generator=gen) * 4).long()
    ends = torch.where(after, cols, G)
    end = G + torch.zeros_like(start)
    for k in range(4, 0, -1):  # the k-th line start after `start`, the most lines that fit
        kth = torch.where(nth == k, ends, G).min(1).values
        fits = (k <= want) & (kth - start <= EXPAND_SPAN)
        end = torch.where(fits & (end == G), kth, end)
    end = torch.where(end == G, torch.clamp(start + EXPAND_SPAN, max=G), end)
    return start, end


def expand_span(region: torch.Tensor, start: torch.Tensor, end: torch.Tensor, pad: torch.Tensor,
                squeeze: torch.Tensor, t: torch.Tensor, eos_id: int, expand_id: int, gen: torch.Generator) -> tuple:
    """DreamOn's training canvas for span rows (region (B, G): the answer columns; [start, end)
    the hole). A row with `squeeze` hides each of the hole's tokens with probability t (its noise
    level) and joins each two neighbouring hidden tokens with a rate drawn for the row from
    U(0, 1): a run of joined tokens is one position whose target is `expand_id` (at inference it
    becomes two masks), a hidden token alone keeps its target; a row without hides the whole
    hole. `pad` end-of-text tokens (DreamOn's deletions, hidden) follow the hole. The row's later
    tokens move left or right to follow; those pushed past G leave the row, and the columns left
    empty at its end are padding. Returns (targets (B, G), hidden positions (B, G) bool, real
    columns (B, G) bool)."""
    B, G = region.shape
    cols = torch.arange(G)[None, :]
    inside = (cols >= start[:, None]) & (cols < end[:, None])
    hidden = inside & ((torch.rand(B, G, generator=gen) < t[:, None]) | ~squeeze[:, None])
    before = torch.cat([torch.zeros(B, 1, dtype=torch.bool), hidden[:, :-1]], 1)
    rate = torch.rand(B, 1, generator=gen)
    join = squeeze[:, None] & hidden & before & (cols > start[:, None]) & (torch.rand(B, G, generator=gen) < rate)
    head = ~join
    group = head.long().cumsum(1) - 1  # each column's position once joined runs are one
    size = torch.zeros(B, G, dtype=torch.long).scatter_add_(1, group, torch.ones_like(group))
    token = torch.where(head & hidden & (size.gather(1, group) > 1), expand_id, region)
    new = group + torch.where(cols >= end[:, None], pad[:, None], 0)
    dest = torch.where(head, new, G).clamp(max=G)
    out = torch.full((B, G + 1), eos_id, dtype=region.dtype).scatter_(1, dest, token)[:, :G]
    hid = torch.zeros(B, G + 1, dtype=torch.bool).scatter_(1, dest, head & hidden)[:, :G]
    hole_end = (head & (cols < end[:, None])).sum(1)  # where the padding starts
    padding = (cols >= hole_end[:, None]) & (cols < (hole_end + pad)[:, None])
    out = torch.where(padding, eos_id, out)
    valid = cols < (head.sum(1) + pad)[:, None]
    return out, (hid | padding) & valid, valid


def block_attention(positions: torch.Tensor, real: torch.Tensor | None, size: int) -> torch.Tensor:
    """The block-diffusion training mask over [noisy | clean] (2n columns, both halves at the
    same positions): a query attends to its own block in its own half; a noisy query also to
    the clean blocks before its block; a clean query to the clean blocks up to its own; the clean
    half never sees the noisy half. `real` (B, n) masks padding. Returns (B, 1, 2n, 2n)."""
    blk = positions // size
    n = blk.shape[1]
    b2 = torch.cat([blk, blk], 1)
    half = torch.arange(2 * n, device=blk.device) >= n  # True = clean
    qb, kb = b2[:, :, None], b2[:, None, :]
    qc, kc = half[None, :, None], half[None, None, :]
    allowed = ((qc == kc) & (qb == kb)) | (~qc & kc & (kb < qb)) | (qc & kc & (kb <= qb))
    if real is not None:
        allowed = allowed & torch.cat([real, real], 1)[:, None, :]
    return allowed[:, None]


def block_loss(model, b: Batch, mask_id: int, eps: float, gen: torch.Generator, edit_noise: float = 0.0,
               edit_weight: float = 1.0, first_word: int = len(SPECIALS)) -> torch.Tensor:
    """Sum over rows of the block-diffusion loss with token shift (divide by rows x canvas length).

    Blocks are `bd_size` positions counted from position 0 (the prompt's first token), as at
    inference. Each (row, block) draws its own noise level t ~ U(eps, 1); answer positions
    (end-of-text padding included) are masked with probability t in the noisy copy. With
    `edit_noise` (the editing objective), each (row, block) also draws u ~ U(0, edit_noise) and
    replaces that share of its visible answer positions by random words, ids >= `first_word`
    (never the clean token; an end-of-text position becomes a word); every visible answer position is then scored too, weight
    `edit_weight`, so the model learns to keep a right token and to repair a wrong one. A position
    is scored by the hidden state before it (token shift): inside a block, by the noisy copy's
    previous position, weighted 1/t where masked; the first position of a block, by the clean
    copy's last position of the previous block, always (the AR step that proposes the first token
    of the next block at inference, whether or not that position is masked in the noisy copy).
    """
    size = model.config.block_size
    R, n = b.ids.shape
    P = b.prompt_len
    blk = b.positions // size
    t = eps + (1 - eps) * torch.rand(R, int(blk.max()) + 1, generator=gen)
    t_pos = t.gather(1, blk)
    answer = torch.arange(n)[None, :] >= P
    masked = (torch.rand(R, n, generator=gen) < t_pos) & answer
    noisy = torch.where(masked, mask_id, b.ids)
    visible = answer & ~masked
    if edit_noise:
        vocab = model.config.vocab_size
        u = edit_noise * torch.rand(R, t.shape[1], generator=gen)
        corrupt = (torch.rand(R, n, generator=gen) < u.gather(1, blk)) & visible
        shift = torch.randint(1, vocab - first_word, (R, n), generator=gen)  # never the clean token
        wrong = first_word + (b.ids - first_word + shift).remainder(vocab - first_word)
        noisy = torch.where(corrupt, wrong, noisy)
    first = (b.positions % size == 0)[:, P:]  # (R, G) answer positions that open a block
    cols = torch.arange(P, n)[None, :] - 1
    source = torch.where(first, cols + n, cols)  # hidden column that scores each answer position
    logits = model(torch.cat([noisy, b.ids], 1), torch.cat([b.positions, b.positions], 1),
                   logits_slice=source, attn_mask=block_attention(b.positions, b.key_mask, size))
    target = b.ids[:, P:]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none").view(R, -1)
    weight = torch.where(first, 1.0, masked[:, P:] / t_pos[:, P:])
    if edit_noise:
        weight = weight + torch.where(first, 0.0, edit_weight * visible[:, P:].float())
    return (ce * weight).sum()


def ar_loss(model, b: Batch) -> torch.Tensor:
    """Sum of next-token cross-entropy over the answer and its end-of-text token (divide by
    `ar_targets(b)` for the mean)."""
    P = b.prompt_len
    logits = model(b.ids, b.positions, key_mask=b.key_mask, logits_slice=slice(P - 1, -1))
    target = b.ids[:, P:]
    G = target.shape[1]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none").view(-1, G)
    return (ce * _ar_keep(b)).sum()


def _ar_keep(b: Batch) -> torch.Tensor:
    G = b.ids.shape[1] - b.prompt_len
    return torch.arange(G)[None, :] <= b.answer_len[:, None]  # the answer and its end-of-text token


def ar_targets(b: Batch) -> int:
    return int(_ar_keep(b).sum())


def train_step(model, batches: list[Batch], cfg: "TrainConfig", mask_id: int, gen: torch.Generator,
               eos_id: int | None = None, expand_id: int | None = None, line_id: int | None = None) -> float:
    """Forward and backward over a batch split into length groups; gradients accumulate to exactly
    those of the whole batch's mean loss. Returns that loss."""
    if cfg.kind == "dflash":  # the weighted mean over both groups' blocks
        from unmask.train.dflash import dflash_loss

        parts = [dflash_loss(model, b, cfg.anchors, cfg.loss_gamma, gen) for b in batches]
        loss = sum(p[0] for p in parts) / sum(p[1] for p in parts).clamp(min=1e-6)
        loss.backward()
        return float(loss.detach())
    if cfg.kind in ("diffusion", "renoise"):
        rows = sum(b.ids.shape[0] for b in batches)
        t = noise_levels(rows, cfg.eps, gen)
        denom = rows * cfg.gen_length
    elif cfg.kind == "block":
        denom = sum(b.ids.shape[0] for b in batches) * cfg.gen_length
    else:
        denom = sum(ar_targets(b) for b in batches)
    total, r = torch.zeros(()), 0
    for b in batches:
        n = b.ids.shape[0]
        if cfg.kind == "diffusion":
            loss = diffusion_loss(model, b, mask_id, t[r : r + n], gen, cfg.span_rate, cfg.span_pad, eos_id,
                                  cfg.span_expand, expand_id, line_id) / denom
        elif cfg.kind == "renoise":
            from unmask.train.renoise import renoise_loss

            loss = renoise_loss(model, b, t[r : r + n], cfg.self_cond, gen) / denom
        elif cfg.kind == "block":
            loss = block_loss(model, b, mask_id, cfg.eps, gen, cfg.edit_noise, cfg.edit_weight) / denom
        else:
            loss = ar_loss(model, b) / denom
        loss.backward()
        total += loss.detach()
        r += n
    return float(total)  # one host sync per optimizer step


def lr_at(cfg: TrainConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
