"""Infilling: a hole with text on both sides (issue 35). The canvas is prompt + hole + suffix; a
full-attention masked model decodes the hole against both sides, every cache included; models
that cannot see text after the hole refuse it by name."""

import pytest
import torch

from unmask import GenerationParams, UnmaskError


def _reference_infill(model, mask_id: int, prefix: list[int], suffix: list[int], gen_length: int,
                      block_length: int, steps: int) -> list[int]:
    """LLaDA's `generate` loop (greedy, low-confidence remasking, even schedule per block) on the
    canvas prefix + masks + suffix, one row, no cache: written here from the reference's rules,
    independently of the engine."""
    P = len(prefix)
    x = torch.tensor([prefix + [mask_id] * gen_length + suffix])
    pos = torch.arange(x.shape[1])[None]
    blocks = gen_length // block_length
    spb = steps // blocks
    for b in range(blocks):
        s, e = P + b * block_length, P + (b + 1) * block_length
        n = (x[0, s:e] == mask_id).sum().item()
        quota = [n // spb + (1 if i < n % spb else 0) for i in range(spb)]
        for k in quota:
            with torch.no_grad():
                logits = model(x, pos)
            prob = torch.softmax(logits[0].float(), -1)
            conf, tok = prob.max(-1)
            cand = torch.zeros_like(conf, dtype=torch.bool)
            cand[s:e] = x[0, s:e] == mask_id
            conf = conf.masked_fill(~cand, -torch.inf)
            top = torch.topk(conf, k).indices
            x[0, top] = tok[top]
    return x[0, P : P + gen_length].tolist()


def test_a_hole_is_decoded_against_the_text_after_it(llada):
    """The engine's decode of prompt + hole + suffix (rows of different suffix lengths in one
    batch) equals the reference loop on the same canvas, and the suffix changes the fill."""
    prompts, suffixes = [[5, 6, 7], [8, 9]], [[10, 11, 12, 13], [14]]
    p = GenerationParams(gen_length=8, block_length=4, steps=8, early_stop=False)
    out = llada.generate(prompts, p, suffix=suffixes)
    mask = llada.token_ids.mask
    for r, res in enumerate(out.results):
        assert res.raw_ids == _reference_infill(llada.model, mask, prompts[r], suffixes[r], 8, 4, 8), r
    other = llada.generate(prompts, p, suffix=[[20, 21, 22, 23], [24]])
    assert [r.raw_ids for r in other.results] != [r.raw_ids for r in out.results]
    alone = llada.generate([prompts[1]], p, suffix=[suffixes[1]])
    assert alone.results[0].raw_ids == out.results[1].raw_ids  # a row's fill does not depend on its batch


@pytest.mark.parametrize("cache", ["prefix", "dual", "adaptive", "dllm-cache"])
def test_every_cache_decodes_a_hole(llada, cache):
    """Each cache runs with the fixed text after the hole (its K/V come from the full refreshes);
    refreshed every step, a cache decodes exactly as no cache does."""
    prompts, suffixes = [[5, 6, 7], [8, 9]], [[10, 11, 12, 13], [14]]
    base = dict(gen_length=8, block_length=4, steps=8, early_stop=False)
    none = llada.generate(prompts, GenerationParams(**base), suffix=suffixes)
    cached = llada.generate(prompts, GenerationParams(cache=cache, **base), suffix=suffixes)
    assert all(len(r.raw_ids) == 8 for r in cached.results)
    assert sum(s.kind == "window" for s in cached.steps) > 0  # cached steps ran
    if cache != "dllm-cache":
        every = llada.generate(prompts, GenerationParams(cache=cache, refresh_interval=1, **base), suffix=suffixes)
        assert [r.raw_ids for r in every.results] == [r.raw_ids for r in none.results]


def test_models_that_cannot_see_a_suffix_refuse_it(llada, embedded_ar, embedded_block):
    p = GenerationParams(gen_length=8, block_length=8, steps=8)
    with pytest.raises(UnmaskError, match="autoregressive model attends to earlier tokens only"):
        embedded_ar.generate([[5, 6]], embedded_ar.default_params(gen_length=8), suffix=[[7]])
    with pytest.raises(UnmaskError, match="block-diffusion model attends to earlier blocks only"):
        embedded_block.generate([[5, 6]], embedded_block.default_params(gen_length=8), suffix=[[7]])
    with pytest.raises(UnmaskError, match="compat 'llada' reproduces a prompt-only sampler"):
        llada.generate([[5, 6]], GenerationParams(compat="llada", gen_length=8, block_length=8, steps=8),
                       suffix=[[7]])
    mask = llada.token_ids.mask
    with pytest.raises(UnmaskError, match=f"suffix contains the mask token id {mask}"):
        llada.generate([[5, 6]], p, suffix=[[7, mask]])
    with pytest.raises(UnmaskError, match="suffix tokens exceeds the model's maximum"):
        llada.generate([[5, 6]], p, suffix=[[7] * llada.arch.max_positions])
    with pytest.raises(UnmaskError, match="one string or id list per prompt"):
        llada.generate([[5, 6], [7]], p, suffix=[[7]])
    with pytest.raises(UnmaskError, match="outside the vocabulary"):
        llada.generate([[5, 6]], p, suffix=[[10**6]])
