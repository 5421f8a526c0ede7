"""The two-interval cache after dLLM-Cache (`--cache dllm-cache`): its forward pattern, and the
engine's invariants with it."""

import pytest

from unmask import GenerationParams
from unmask.cache.dllm import DLLMCache

PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6, 5], [2, 7, 1], [8, 2, 8, 1, 8, 2]]


@pytest.mark.parametrize("fixture", ["llada", "dream"])
@pytest.mark.parametrize("interval", [None, 3])
def test_prompt_rarely_response_often_block_otherwise(request, fixture, interval):
    llm = request.getfixturevalue(fixture)
    shift, every = llm.arch.logit_shift, interval or DLLMCache.refresh_interval
    p = GenerationParams(gen_length=32, block_length=8, cache="dllm-cache", refresh_interval=interval, early_stop=False)
    out = llm.generate([PROMPTS[0]], p)  # one token per step: 32 steps over 4 blocks
    P, L = len(PROMPTS[0]), len(PROMPTS[0]) + 32
    assert len(out.steps) == 32
    for age, s in enumerate(out.steps):
        if age % DLLMCache.PROMPT_INTERVAL == 0:  # counted from the row's first step, not per block
            assert (s.kind, s.positions) == ("full", L)
        elif age % every == 0:  # the whole response against the cached prompt
            assert (s.kind, s.positions) == ("window", L - P + shift)
        else:  # the open block
            assert (s.kind, s.positions) == ("window", 8 + shift)


@pytest.mark.parametrize("fixture", ["llada", "dream"])
@pytest.mark.parametrize("kw", [dict(policy="fixed"), dict(policy="threshold", threshold=0.5),
                                dict(policy="entropy", gamma=0.5)])
def test_rows_alone_equal_rows_in_a_batch(request, fixture, kw):
    llm = request.getfixturevalue(fixture)
    p = GenerationParams(gen_length=16, block_length=8, cache="dllm-cache", **kw)
    batch = llm.generate(PROMPTS, p).results
    for prompt, row in zip(PROMPTS, batch):
        alone = llm.generate([prompt], p).results[0]
        assert alone.raw_ids == row.raw_ids and alone.nfe == row.nfe
        assert llm.token_ids.mask not in row.raw_ids or row.finish_reason == "stop"


def test_refused_where_it_does_not_apply(embedded_block, llada):
    from unmask import UnmaskError

    with pytest.raises(UnmaskError, match="cache 'dllm-cache' approximates a full-attention model's K/V"):
        embedded_block.generate([[3, 4]], embedded_block.default_params(cache="dllm-cache"))
    with pytest.raises(UnmaskError, match="refresh_tokens 2 is a setting of cache adaptive"):
        GenerationParams(cache="dllm-cache", refresh_tokens=2).check()
