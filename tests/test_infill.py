"""Infilling: a hole with text on both sides (issue 35). The canvas is prompt + hole + suffix; a
full-attention masked model decodes the hole against both sides, every cache included; models
that cannot see text after the hole refuse it by name."""

import dataclasses

import pytest
import torch

from unmask import GenerationParams, UnmaskError


def _reference_infill(model, mask_id: int, prefix: list[int], suffix: list[int], gen_length: int,
                      block_length: int, steps: int, region: list[int] | None = None) -> list[int]:
    """LLaDA's `generate` loop (greedy, low-confidence remasking, even schedule per block over
    the block's masks) on the canvas prefix + masks + suffix (or prefix + `region` + suffix, a
    region holding fixed text between holes), one row, no cache: written here from the
    reference's rules, independently of the engine."""
    P = len(prefix)
    x = torch.tensor([prefix + (region if region is not None else [mask_id] * gen_length) + suffix])
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
    mask = llada.token_ids.mask
    with pytest.raises(UnmaskError, match=f"suffix contains the mask token id {mask}"):
        llada.generate([[5, 6]], p, suffix=[[7, mask]])
    with pytest.raises(UnmaskError, match="suffix tokens exceeds the model's maximum"):
        llada.generate([[5, 6]], p, suffix=[[7] * llada.arch.max_positions])
    with pytest.raises(UnmaskError, match="one string or id list per prompt"):
        llada.generate([[5, 6], [7]], p, suffix=[[7]])
    with pytest.raises(UnmaskError, match="outside the vocabulary"):
        llada.generate([[5, 6]], p, suffix=[[10**6]])


# ---- templates: several holes in one text ----------------------------------------------------------

TEMPLATE = "w1 w2 w3 <|hole:4|> w5 w6 <|hole:3|> w7 w8"


def test_a_template_decodes_its_holes_as_one_block_over_the_masks(llada):
    """Several holes: the region (first hole to last, fixed text between) decodes as one block
    whose schedule covers the hole positions; equal to the reference loop on that canvas."""
    from unmask import holes

    mask = llada.token_ids.mask
    t = holes.encode(llada.tokenizer, TEMPLATE, mask, 8)
    assert len(t.region) == 4 + 2 + 3 and t.holes == ((0, 4), (6, 9)) and t.fill == t.region
    out = llada.infill(TEMPLATE, GenerationParams(policy="fixed", early_stop=True, hole_length="exact"))
    res = out.results[0]
    ref = _reference_infill(llada.model, mask, t.prompt, t.suffix, 9, 9, 7, region=t.region)
    assert res.raw_ids == ref
    assert res.raw_ids[4:6] == t.region[4:6]  # the fixed text is never touched
    assert mask not in res.raw_ids and res.nfe == 7  # one token per step over the 7 hole positions
    assert len(res.holes) == 2 and " w5 w6 " in f" {res.text} "
    half = llada.infill(TEMPLATE, GenerationParams(policy="fixed", gen_length=8, steps=4,
                                                   hole_length="exact")).results[0]
    assert half.nfe == 4  # the given tokens per step (steps / gen_length = 1/2) on 7 masks


@pytest.mark.parametrize("hole_length", ["exact", "bound"])
@pytest.mark.parametrize("cache", ["prefix", "dual", "adaptive"])
def test_templates_under_every_cache_refreshed_each_step_equal_no_cache(llada, cache, hole_length):
    p = dict(policy="threshold", threshold=0.3, early_stop=False, hole_length=hole_length)
    base = llada.infill([TEMPLATE, "w9 <|hole:2|> w4 <|hole:5|> w3"], GenerationParams(**p))
    every = llada.infill([TEMPLATE, "w9 <|hole:2|> w4 <|hole:5|> w3"],
                         GenerationParams(cache=cache, refresh_interval=1, **p))
    assert [r.raw_ids for r in every.results] == [r.raw_ids for r in base.results]
    cached = llada.infill(TEMPLATE, GenerationParams(cache=cache, **p)).results[0]
    assert llada.token_ids.mask not in cached.raw_ids


def test_one_hole_templates_are_prompt_hole_suffix(llada):
    p = GenerationParams(gen_length=8, block_length=4, steps=8)
    one = llada.infill("w1 w2 <|hole|> w3 w4", p).results[0]
    plain = llada.generate("w1 w2", p, suffix="w3 w4", chat=False).results[0]
    assert one.raw_ids == plain.raw_ids and one.holes == [plain.text]
    at_end = llada.infill("w1 w2 <|hole:4|>", p).results[0]
    assert at_end.raw_ids == llada.generate("w1 w2", GenerationParams(gen_length=4, block_length=4, steps=4),
                                            chat=False).results[0].raw_ids


def test_bounded_holes_decode_one_after_another(llada):
    """Holes whose lengths are bounds (the native default): hole by hole, left to right, each the
    single hole of prompt + the text before it (earlier holes filled) + the fixed text up to the next
    hole; a revising policy may run (it revises only the hole it decodes)."""
    p = GenerationParams(policy="fixed", gen_length=8, block_length=8, steps=8)
    res = llada.infill(TEMPLATE, p).results[0]
    first = llada.generate("w1 w2 w3", dataclasses.replace(p, gen_length=4, block_length=4, steps=4),
                           suffix=" w5 w6", chat=False).results[0]
    assert res.holes[0] == first.text
    second = llada.generate(f"w1 w2 w3 {first.text} w5 w6".replace("  ", " "), dataclasses.replace(
        p, gen_length=3, block_length=3, steps=3), suffix=" w7 w8", chat=False).results[0]
    assert res.holes[1] == second.text and res.nfe == first.nfe + second.nfe
    assert len(res.raw_ids) == 9 and res.raw_ids[4:6] == llada.tokenizer.encode(" w5 w6", add_special_tokens=False)
    edited = llada.infill(TEMPLATE, GenerationParams(policy="remdm")).results[0]
    assert len(edited.holes) == 2


def test_hole_texts_are_cut_at_their_end_of_text():
    from unmask import holes

    t = holes.Template([1], [0, 0, 0, 7, 0, 0], [], ((0, 3), (4, 6)))
    assert holes.hole_ids(t, [5, 9, 6, 7, 8, 9], [9]) == [[5], [8]]
    assert holes.region_ids(t, [[5], [8]]) == [5, 7, 8]
    assert holes.fill_in("a <|hole:3|> b <|hole|> c", ["x", "y"]) == "a x b y c"


def test_template_refusals(llada, embedded_block):
    with pytest.raises(UnmaskError, match="revises committed tokens and could rewrite the fixed text"):
        llada.infill(TEMPLATE, GenerationParams(policy="remdm", hole_length="exact"))
    with pytest.raises(UnmaskError, match="block-diffusion model attends to earlier blocks only"):
        embedded_block.infill("copy : red <|hole:4|> owl")
    with pytest.raises(UnmaskError, match="compat 'llada' reproduces a sampler's batch of one shape"):
        llada.infill(TEMPLATE, GenerationParams(compat="llada", gen_length=8, block_length=8, steps=8))
    for bad, needle in [("w1 <|hole:x|>", "is not a hole marker"), ("<|hole:3|> w1", "text before the first hole"),
                        ("w1 w2", "template has no hole"), ("w1 <|hole:0|>", "has no room"),
                        ("w1 <|hole:3|> banana", "not in the vocabulary: 'banana'"),
                        ("w1 <|hole:600|>", "exceeds the model's maximum")]:
        with pytest.raises(UnmaskError, match=needle):
            llada.infill(bad)
    with pytest.raises(UnmaskError, match="template 1: "):
        llada.infill(["w1 <|hole:2|>", "w1 w2"])
