"""DiffusionGemma's `generate` (transformers, models/diffusion_gemma/generation_diffusion_gemma.py),
reproduced token for token with the same seed (`compat diffusion-gemma`).

A renoising sampler: nothing is masked. Per canvas of `canvas_length` tokens (ceil(gen_length /
canvas_length) canvases; the batch stops early once every row has ended):
1. the encoder writes the new tokens into the KV cache: the prompts first (left-padded, the padding
   masked, positions counted from the first column for every row, as the reference counts them),
   then each finished canvas (its padding included and attended to, as the reference does);
2. the canvas starts as uniform random tokens (`torch.randint(0, V, (B, L))`);
3. each denoising step, for cur_step = N .. 1 (N = max_denoising_steps): the denoiser scores the
   canvas, self-conditioned on the previous step's processed logits; processed = logits / T with
   T = t_min + (t_max - t_min) * cur_step / N (float32, as its logits processor computes it);
   every position draws a token (`torch.multinomial` over the flattened (B*L, V) probabilities);
   the positions of lowest entropy are accepted while sum(sorted H) - H <= gamma; the others are
   renoised to fresh uniform tokens (a second `randint` (B, L)); a row whose canvas is stable
   (argmax unchanged for `stability_threshold` steps) and confident (mean entropy below
   `confidence_threshold`) stops denoising and keeps its state;
4. the row's **argmax** canvas (not the sampled one) is appended; a row that holds an end-of-text
   id has finished: the rest of its canvas after the first one, and all its later canvases, are
   padding.
Random draws use torch's global generator in the reference's order and shapes (every row draws,
finished or not), so `seed` S means `torch.manual_seed(S)` right before the reference's call. The
end-of-text ids are the checkpoint's stop ids (generation_config.json's eos_token_id where it names
them, as the reference reads them). Forwards per row count the denoising steps the row took part in
(the reference's count); each canvas also costs one encoder pass, not counted there.
"""

import time

import torch

from unmask.models.base import TokenIds
from unmask.kv.renoise import RenoiseKV
from unmask.models.diffusion_gemma import DiffusionGemmaModel
from unmask.params import GenerationParams
from unmask.sampler.renoise import accept_mask, categorical_entropy
from unmask.trace import Decoded, ForwardRecord


def temperature(p: GenerationParams, cur_step: int) -> torch.Tensor:
    """The linear schedule in the reference's float32 arithmetic (cur_step counts down N..1)."""
    frac = torch.tensor(cur_step, dtype=torch.int32) / p.max_denoising_steps
    return p.t_min + (p.t_max - p.t_min) * frac


@torch.inference_mode()
def decode_diffusion_gemma(model: DiffusionGemmaModel, tokens: TokenIds, prompts: list[list[int]],
                           params: GenerationParams) -> Decoded:
    device = next(model.parameters()).device
    B, P = len(prompts), max(len(p) for p in prompts)
    L, V = model.config.canvas_length, model.config.vocab_size
    pad = tokens.pad
    ids = torch.full((B, P), 0 if pad is None else pad, dtype=torch.long, device=device)
    attn = torch.zeros(B, P, dtype=torch.bool, device=device)
    for r, p in enumerate(prompts):  # host-side setup, once per batch
        ids[r, P - len(p):] = torch.tensor(p, device=device)
        attn[r, P - len(p):] = True
    eos = torch.tensor(tokens.stop, device=device)
    if params.seed is not None:
        torch.manual_seed(params.seed)
    lay = model.config.layout
    cache = RenoiseKV(lay.sliding, lay.window, B, device)
    out = torch.empty(B, 0, dtype=torch.long, device=device)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    row_nfe = torch.zeros(B, dtype=torch.long, device=device)
    commits: list[list[int]] = [[] for _ in range(B)]
    steps: list[ForwardRecord] = []
    new, new_mask, start = ids, attn, 0
    for _ in range(-(-params.gen_length // L)):
        positions = torch.arange(start, start + new.shape[1], device=device)[None].expand(B, -1)
        with cache.writing(positions, torch.ones_like(new_mask), new_mask):
            model.encode(new, positions, cache)
        start += new.shape[1]
        canvas, denoised_nfe = _denoise_canvas(model, params, cache, start, B, L, V, finished, steps, device)
        row_nfe += denoised_nfe
        out = torch.cat([out, canvas], dim=-1)
        ended = torch.isin(canvas, eos).any(-1) | (out.shape[1] >= params.gen_length)
        finished_before, finished = finished, finished | ended
        if pad is not None and bool(finished.any()):
            out[finished_before, -L:] = pad
            if bool(ended.any()):  # after the first end of text, padding (every row, as the reference does)
                last = out[:, -L:]
                is_eos = torch.isin(last, eos)
                run = is_eos.cumsum(-1)
                last[(run > 0) & ~((run == 1) & is_eos)] = pad
        kept = (out[:, -L:] != pad).sum(-1) if pad is not None else torch.full((B,), L)
        for r, (n, k) in enumerate(zip(denoised_nfe.tolist(), kept.tolist())):  # host bookkeeping, once per canvas
            commits[r].extend([0] * (n - 1) + [k] if n else [])
        if bool(finished.all()):
            break
        new, new_mask = out[:, -L:], torch.ones(B, L, dtype=torch.bool, device=device)
    return Decoded(rows=out.tolist(), row_nfe=row_nfe.tolist(), row_commits=commits, steps=steps, cache="none",
                   prompt_len=P)


def _denoise_canvas(model, params, cache, start, B, L, V, finished, steps, device):
    """One canvas's denoising loop -> (argmax canvas (B, L), denoising forwards per row (B,))."""
    positions = torch.arange(start, start + L, device=device)[None].expand(B, -1)
    canvas = torch.randint(0, V, (B, L), device=device)
    argmax, sc = canvas, None
    done = torch.zeros(B, dtype=torch.bool, device=device)
    nfe = torch.zeros(B, dtype=torch.long, device=device)
    k = params.stability_threshold
    history = torch.full((k, B, L), -1, dtype=torch.long, device=device) if k else None
    for cur_step in range(params.max_denoising_steps, 0, -1):
        t0 = time.perf_counter()
        active = ~(done | finished)
        nfe += active
        logits = model.denoise(canvas, positions, cache, sc)
        processed = logits / temperature(params, cur_step).to(device)
        probs = torch.softmax(processed, dim=-1, dtype=torch.float32)
        sample = torch.multinomial(probs.view(-1, V), num_samples=1).view(B, L)
        new_argmax = processed.argmax(-1)
        accepted = accept_mask(categorical_entropy(processed), params.gamma)
        noise = torch.randint(0, V, (B, L), device=device)
        new_canvas = torch.where(~accepted, noise, torch.where(accepted, sample, canvas))
        if bool(done.any()):  # a stopped row keeps its state
            new_argmax = torch.where(done[:, None], argmax, new_argmax)
            new_canvas = torch.where(done[:, None], canvas, new_canvas)
            processed = torch.where(done[:, None, None], sc, processed)
        if k:
            stable = (history == new_argmax[None]).all(-1).all(0)
            history = torch.roll(history, shifts=-1, dims=0)
            history[-1] = new_argmax
        else:
            stable = torch.ones(B, dtype=torch.bool, device=device)
        done = done | (stable & (categorical_entropy(processed).mean(-1) < params.confidence_threshold))
        canvas, argmax, sc = new_canvas, new_argmax, processed
        n = int(active.sum())
        steps.append(ForwardRecord(kind="full", rows=n, positions=float(L), committed=0,
                                   seconds=time.perf_counter() - t0))
        if bool(done.all()):
            break
    return argmax, nfe
