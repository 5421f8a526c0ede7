"""DFlash speculative decoding, one request, as the release's `dflash_generate` runs it
(z-lab/dflash `dflash/model.py`), over unmask models: an autoregressive target (a causal
DiffusionLM, the AR twin) and a DFlash drafter (unmask.models.dflash).

Each round: the drafter fills `[last verified token, MASK x (B - 1)]` from the target's features of
the positions verified since its last round; the target scores the block in one forward; the
accepted length is the leading run where the draft equals the target's own choice (greedy: its
argmax; sampled: its sample at the request's temperature), plus the target's bonus token; the
target's KV cache is cut back past the first rejection, and the features of the accepted
positions are the drafter's next context. The output is the target's: greedy decoding gives
exactly the target's greedy tokens, whatever the drafter proposes.

This is the offline loop (one request, the reference's order of operations); speculative rows in
the request engine are not built yet (issue 24).
"""

from dataclasses import dataclass, field

import torch

from unmask.kv.draft import DraftCache
from unmask.models.dflash import DFlashDrafter


class _GrowingKV:
    """The target's KV cache for one request: every position so far, cut back after a rejection."""

    def __init__(self, num_layers: int) -> None:
        self.k: list = [None] * num_layers
        self.v: list = [None] * num_layers
        self.length = 0  # keys attended over by the coming forward (set before it)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, start: int):
        if self.k[layer] is not None:
            k = torch.cat([self.k[layer][:, :, :start], k], dim=2)
            v = torch.cat([self.v[layer][:, :, :start], v], dim=2)
        self.k[layer], self.v[layer] = k, v
        return k, v

    def crop(self, n: int) -> None:
        self.k = [None if t is None else t[:, :, :n] for t in self.k]
        self.v = [None if t is None else t[:, :, :n] for t in self.v]


@dataclass
class Speculated:
    tokens: list[int]  # the generated tokens (after the prompt), cut after the first stop token
    accepted: list[int] = field(default_factory=list)  # tokens each verify forward produced (accepted + bonus)
    target_forwards: int = 0  # the prefill and every verify forward
    draft_forwards: int = 0


def _pick(logits: torch.Tensor, temperature: float, generator) -> torch.Tensor:
    if temperature < 1e-5:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])


@torch.inference_mode()
def autoregressive(target, prompt: list[int], max_new_tokens: int, stop_ids=()) -> list[int]:
    """The target's own greedy decoding, one token per forward with its KV cache (what a lossless
    speculative decode must reproduce), cut after the first stop token."""
    device = next(target.parameters()).device
    ids = torch.tensor([prompt], device=device)
    kv = _GrowingKV(target.config.num_layers)
    out, start, stops = [], 0, set(stop_ids)
    while len(out) < max_new_tokens:
        kv.length = start + ids.shape[1]
        pos = torch.arange(start, kv.length, device=device)[None]
        logits = target(ids, pos, kv, start, None, slice(ids.shape[1] - 1, ids.shape[1]))
        start = kv.length
        out.append(int(logits[0, -1].argmax()))
        if out[-1] in stops:
            break
        ids = torch.tensor([[out[-1]]], device=device)
    return out


@torch.inference_mode()
def speculate(target, drafter: DFlashDrafter, prompt: list[int], max_new_tokens: int, stop_ids=(),
              temperature: float = 0.0, mask_id: int | None = None, generator=None) -> Speculated:
    """Decode `max_new_tokens` after `prompt` with `target` (a causal DiffusionLM: hidden j scores
    token j + 1) drafting blocks with `drafter`."""
    c = drafter.config
    B = c.block_size
    mask = c.mask_token_id if mask_id is None else mask_id
    if mask is None:
        raise ValueError("the drafter names no mask token (dflash_config.mask_token_id); pass mask_id")
    device = next(target.parameters()).device
    layers = tuple(c.target_layer_ids)
    P = len(prompt)
    total = P + max_new_tokens
    out = torch.full((1, total + B), mask, dtype=torch.long, device=device)
    out[0, :P] = torch.tensor(prompt, device=device)
    pos = torch.arange(out.shape[1], device=device)[None]
    kv = _GrowingKV(target.config.num_layers)
    kv.length = P
    logits, feats = target(out[:, :P], pos[:, :P], kv, 0, None, slice(P - 1, P), capture=layers)
    out[0, P] = _pick(logits[:, -1], temperature, generator)[0]
    res = Speculated([], target_forwards=1)
    dcache = DraftCache(c.num_layers)
    stops = torch.tensor(list(stop_ids) or [-1], device=device)
    start = P
    while start < total:
        block = out[:, start : start + B].clone()
        hidden = drafter(target.embed(block), feats, pos[:, dcache.length : start + B], dcache)
        block[:, 1:] = target.head(hidden[:, 1:]).argmax(-1)  # the release drafts greedily
        res.draft_forwards += 1
        kv.length = start + B
        logits, block_feats = target(block, pos[:, start : start + B], kv, start, None, None, capture=layers)
        res.target_forwards += 1
        post = _pick(logits, temperature, generator)
        n = int((block[:, 1:] == post[:, :-1]).cumprod(dim=1).sum())
        out[:, start : start + n + 1] = block[:, : n + 1]
        out[:, start + n + 1] = post[:, n]
        start += n + 1
        kv.crop(start)
        res.accepted.append(n + 1)
        feats = block_feats[:, : n + 1]
        if bool(torch.isin(out[0, P : start + 1], stops).any()):
            break
    gen = out[0, P : min(start + 1, total)].tolist()
    hit = [i for i, t in enumerate(gen) if t in set(stop_ids)]
    res.tokens = gen[: hit[0] + 1] if hit else gen
    return res
