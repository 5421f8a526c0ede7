"""The AR twin's dedicated offline loop: greedy next-token decoding with a KV cache on the
left-padded canvas (unmask.canvas), one batch in lockstep.

One forward prefills the prompt; each further forward feeds one token and reads the cached
keys/values; finished rows leave the batch. `LLM.generate` uses it for the twin's greedy
decode only because it is faster per forward than the request engine at this size
(benchmarks/ar_offline.py); the engine (cache "causal") writes the same tokens (tested) and
serves everything else: sampling with per-request generators, early_stop False, serving.
Gumbel-max sampling here draws from one generator for the batch (used by the tests' references).
"""

import time

import torch

from unmask.cache.kv import StaticKV
from unmask.canvas import Canvas, retire_rows
from unmask.models.base import DiffusionLM, TokenIds
from unmask.trace import Decoded, ForwardRecord


def _next_token(logits: torch.Tensor, mask_id: int, temperature: float, gen) -> torch.Tensor:
    logits = logits.float().clone()
    logits[:, mask_id] = -torch.inf
    if temperature > 0:
        u = torch.rand(logits.shape, dtype=torch.float64, generator=gen, device=logits.device)
        return (logits.double().exp() / (-torch.log(u)) ** temperature).argmax(-1)
    return logits.argmax(-1)


@torch.inference_mode()
def decode_ar(
    model: DiffusionLM,
    tokens: TokenIds,
    prompts: list[list[int]],
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int | None = None,
) -> Decoded:
    if not model.config.causal:
        raise ValueError("autoregressive decoding needs a causal model (config 'causal': true)")
    device = next(model.parameters()).device
    pad = tokens.pad if tokens.pad is not None else tokens.eos
    c = Canvas.build(prompts, max_new_tokens, tokens.mask, pad, device)
    P, L, B0 = c.prompt_len, c.length, c.batch
    out = c.x.clone()
    stops = torch.tensor(tokens.stop, device=device)
    gen = torch.Generator(device).manual_seed(seed) if seed is not None else None
    kv = StaticKV(model.config.num_layers, L)
    row_nfe = torch.zeros(B0, dtype=torch.long, device=device)
    steps: list[ForwardRecord] = []
    start, width = 0, P  # first forward: the whole prompt
    for t in range(P, L):
        t0 = time.perf_counter()
        logits = model(c.x[:, start : start + width], c.positions[:, start : start + width], kv, start,
                       c.key_mask, slice(width - 1, width))
        c.x[:, t] = _next_token(logits[:, -1], tokens.mask, temperature, gen)
        row_nfe.index_add_(0, c.rows, torch.ones_like(c.rows))
        done = torch.isin(c.x[:, t], stops)
        any_done = bool(done.any())
        steps.append(ForwardRecord("full" if t == P else "window", c.batch, width, c.batch, block=0))
        if any_done:
            retire_rows(c, out, done, kv)
        steps[-1].seconds = time.perf_counter() - t0
        if c.batch == 0:
            break
        start, width = t, 1
    if c.batch:
        out[c.rows] = c.x
    nfe = row_nfe.tolist()
    return Decoded(out[:, P:].tolist(), nfe, [[1] * n for n in nfe], steps, "causal", P)
