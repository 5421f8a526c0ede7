"""Compatibility modes: token for token and NFE for NFE against ports of the reference samplers,
run on a tiny random checkpoint through the real loader."""

import pytest
import torch

from reference import RefModel, dream_generate, fastdllm_dual, fastdllm_generate, fastdllm_prefix, llada_generate
from unmask import GenerationParams

FAST = {"none": fastdllm_generate, "prefix": fastdllm_prefix, "dual": fastdllm_dual}


@pytest.fixture(scope="module")
def ref(llada_dir):
    return RefModel(llada_dir)


@pytest.fixture(scope="module")
def dream_ref(dream_dir):
    return RefModel(dream_dir)


def _prompts(batch, length, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 50, (batch, length), generator=g)


def _ours(llm, prompt, **kw):
    out = llm.generate(prompt.tolist(), GenerationParams(**kw))
    return torch.tensor([r.raw_ids for r in out.results]), out.nfe


CASES = [
    dict(steps=32, gen_length=32, block_length=8),  # one token per step
    dict(steps=8, gen_length=32, block_length=8),  # several tokens per step
    dict(steps=4, gen_length=16, block_length=16),  # one block, uneven quotas (16 / 4)
    dict(steps=12, gen_length=24, block_length=8),  # uneven: 8 masks over 4 steps
    dict(steps=32, gen_length=32, block_length=8, threshold=0.06),
    dict(steps=32, gen_length=32, block_length=8, factor=1.0),
    dict(steps=32, gen_length=32, block_length=16, factor=3.0),
]


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
@pytest.mark.parametrize("batch", [1, 2])
def test_fast_dllm_greedy(llada, ref, cache, case, batch):
    case = dict(case)
    prompt = _prompts(batch, 9, seed=batch)
    mask = llada.token_ids.mask
    theirs, their_nfe = FAST[cache](ref, prompt.clone(), mask_id=mask, **case)
    assert not (theirs == mask).any(), "reference left masks: compare elsewhere"
    policy = "threshold" if "threshold" in case else "factor" if "factor" in case else "fixed"
    ours, nfe = _ours(llada, prompt, compat="fast-dllm", cache=cache, policy=policy, **case)
    assert ours.tolist() == theirs[:, prompt.shape[1]:].tolist()
    assert nfe == their_nfe


@pytest.mark.parametrize("cache", ["none", "prefix"])
def test_fast_dllm_random_remasking_with_seed(llada, ref, cache):
    prompt = _prompts(2, 7)
    torch.manual_seed(11)
    theirs, their_nfe = FAST[cache](ref, prompt.clone(), 16, 32, 8, remasking="random", mask_id=llada.token_ids.mask)
    ours, nfe = _ours(llada, prompt, compat="fast-dllm", cache=cache, steps=16, gen_length=32, block_length=8,
                      remasking="random", seed=11)
    assert ours.tolist() == theirs[:, 7:].tolist() and nfe == their_nfe


def test_fast_dllm_dual_completes_blocks_upstream_leaves_open(llada, ref):
    """Upstream's bounded DualCache loop (steps_per_block forwards) can leave masks; unmask
    completes the block instead (documented deviation)."""
    prompt = _prompts(1, 9)
    mask = llada.token_ids.mask
    theirs, _ = fastdllm_dual(ref, prompt.clone(), 4, 32, 8, threshold=0.9, mask_id=mask)
    ours, _ = _ours(llada, prompt, compat="fast-dllm", cache="dual", policy="threshold", threshold=0.9,
                    steps=4, gen_length=32, block_length=8)
    assert (theirs == mask).any()
    assert not (ours == mask).any()


@pytest.mark.parametrize("temperature,seed", [(0.0, None), (0.7, 5), (1.0, 9)])
@pytest.mark.parametrize("remasking", ["low_confidence", "random"])
@pytest.mark.parametrize("steps,block", [(16, 8), (32, 8), (64, 16)])
def test_llada_official(llada, ref, temperature, seed, remasking, steps, block):
    """Includes steps_per_block > block_length, where LLaDA runs forwards that commit nothing."""
    prompt = _prompts(2, 6, seed=3)
    if seed is not None:
        torch.manual_seed(seed)
    elif remasking == "random":
        torch.manual_seed(0)
        seed = 0
    theirs = llada_generate(ref, prompt.clone(), steps, 32, block, temperature, remasking, llada.token_ids.mask)
    ours, nfe = _ours(llada, prompt, compat="llada", steps=steps, gen_length=32, block_length=block,
                      temperature=temperature, remasking=remasking, seed=seed)
    assert ours.tolist() == theirs[:, 6:].tolist()
    assert nfe == steps


@pytest.mark.parametrize("alg", ["origin", "maskgit_plus", "topk_margin", "entropy"])
@pytest.mark.parametrize("steps", [24, 8, 5])
def test_dream_diffusion_generate(dream, dream_ref, alg, steps):
    prompt = _prompts(1, 8, seed=4)
    torch.manual_seed(21)
    theirs = dream_generate(dream_ref, prompt.clone(), 24, steps, alg=alg, mask_token_id=dream.token_ids.mask)
    ours, nfe = _ours(dream, prompt, compat="dream", alg=alg, steps=steps, gen_length=24, seed=21)
    assert ours.tolist() == theirs[:, 8:].tolist()
    assert nfe == steps


def test_dream_batched_equal_length(dream, dream_ref):
    prompt = _prompts(3, 8, seed=6)
    theirs = dream_generate(dream_ref, prompt.clone(), 16, 8, alg="entropy", mask_token_id=dream.token_ids.mask)
    ours, _ = _ours(dream, prompt, compat="dream", alg="entropy", steps=8, gen_length=16)
    assert ours.tolist() == theirs[:, 8:].tolist()


# ---- infilling: the reference samplers fed prompt + masks + suffix -------------------------------

def _suffix(batch, length, seed):
    return torch.randint(0, 50, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[4]], ids=["fixed1", "fixed4", "threshold"])
def test_fast_dllm_infills_as_its_sampler_decodes_a_canvas_with_a_suffix(llada, ref, cache, case):
    """Fast-dLLM v1's loops decode whatever x holds: given prompt + masks + suffix, compat
    fast-dllm with that suffix commits the same tokens in the same forwards."""
    prompt, suffix = _prompts(2, 7, seed=5), _suffix(2, 6, seed=6)
    mask = llada.token_ids.mask
    theirs, their_nfe = FAST[cache](ref, prompt.clone(), mask_id=mask, suffix=suffix, **case)
    policy = "threshold" if "threshold" in case else "fixed"
    out = llada.generate(prompt.tolist(), GenerationParams(compat="fast-dllm", cache=cache, policy=policy, **case),
                         suffix=suffix.tolist())
    G = case["gen_length"]
    assert [r.raw_ids for r in out.results] == theirs[:, 7 : 7 + G].tolist()
    assert out.nfe == their_nfe
    plain, _ = FAST[cache](ref, prompt.clone(), mask_id=mask, **case)
    assert plain[:, 7 : 7 + G].tolist() != theirs[:, 7 : 7 + G].tolist()  # the suffix mattered


@pytest.mark.parametrize("remasking", ["low_confidence", "random"])
def test_llada_infills_as_its_generate_decodes_a_canvas_with_a_suffix(llada, ref, remasking):
    prompt, suffix = _prompts(2, 6, seed=3), _suffix(2, 5, seed=8)
    torch.manual_seed(4)
    theirs = llada_generate(ref, prompt.clone(), 16, 32, 8, 0.0, remasking, llada.token_ids.mask, suffix=suffix)
    out = llada.generate(prompt.tolist(), GenerationParams(compat="llada", steps=16, gen_length=32, block_length=8,
                                                           remasking=remasking, seed=4),
                         suffix=suffix.tolist())
    assert [r.raw_ids for r in out.results] == theirs[:, 6:38].tolist()
    assert out.nfe == 16


def test_compat_infilling_with_rows_of_different_suffix_lengths(llada, ref):
    """Rows of one batch with suffixes of different lengths (right-padded, masked out of
    attention) decode as each row alone through the reference."""
    prompt = _prompts(2, 6, seed=9)
    suffixes = [[11, 12, 13, 14, 15], [16, 17]]
    p = GenerationParams(compat="fast-dllm", steps=16, gen_length=16, block_length=8)
    out = llada.generate(prompt.tolist(), p, suffix=suffixes)
    for r in range(2):
        theirs, _ = fastdllm_generate(ref, prompt[r : r + 1].clone(), 16, 16, 8, mask_id=llada.token_ids.mask,
                                      suffix=torch.tensor([suffixes[r]]))
        assert out.results[r].raw_ids == theirs[0, 6:22].tolist(), r


@pytest.mark.parametrize("alg", ["origin", "entropy"])
def test_dream_infills_as_diffusion_generate_decodes_input_ids_with_masks(dream, dream_ref, alg):
    """Dream's diffusion_generate unmasks every mask of its input ids: given prompt + masks +
    suffix (and no new tokens), it equals compat dream with that suffix."""
    prompt, suffix = _prompts(1, 8, seed=4), _suffix(1, 5, seed=2)
    mask = dream.token_ids.mask
    canvas = torch.cat([prompt, torch.full((1, 16), mask), suffix], 1)
    torch.manual_seed(21)
    theirs = dream_generate(dream_ref, canvas, 0, 8, alg=alg, mask_token_id=mask)
    out = dream.generate(prompt.tolist(), GenerationParams(compat="dream", alg=alg, steps=8, gen_length=16, seed=21),
                         suffix=suffix.tolist())
    assert [r.raw_ids for r in out.results] == theirs[:, 8:24].tolist()
    assert out.nfe == 8
