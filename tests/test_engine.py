"""Native decoding (the request engine, run offline): invariants, batching, caches, early stop
and the trace."""

from types import SimpleNamespace

import pytest
import torch

from unmask import GenerationParams
from unmask.engine import Engine, EngineConfig
from unmask.models.base import ArchConfig, DiffusionLM, TokenIds


def decode(model, tokens, prompts, params, watch=False):
    """Every prompt added at once, steps until done: what LLM.generate does, on any model."""
    engine = Engine(model, tokens, EngineConfig(trace_limit=None))
    reqs = [engine.add_request(p, params, watch=watch) for p in prompts]
    states = {r.id: [] for r in reqs}
    while engine.has_unfinished():
        for o in engine.step():
            if o.canvas is not None:
                states[o.request.id].append(o.canvas)
    return SimpleNamespace(generated=torch.tensor([r.canvas for r in reqs]), steps=list(engine.trace),
                           nfe=len(engine.trace), row_nfe=[r.nfe for r in reqs], row_commits=[r.commits for r in reqs],
                           states=[states[r.id] for r in reqs])

MASK, EOS = 60, 61


class ScriptedModel(DiffusionLM):
    """Predicts token (3 * position) % 40 with a position-dependent confidence, and EOS from RoPE
    position `eos_at` on; records every canvas window it is given."""

    def __init__(self, eos_at: int = 10_000):
        super().__init__()
        self.config = ArchConfig("llada", 64, 8, 1, 1, 1, 8, 1e4, 1e-5, 4096)
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.eos_at = eos_at
        self.seen: list[torch.Tensor] = []

    def forward(self, input_ids, positions, kv=None, kv_start=0, key_mask=None, logits_slice=None):
        self.seen.append(input_ids.clone())
        if isinstance(logits_slice, torch.Tensor):  # the engine's (B, n) hidden positions per row
            pos = positions.gather(1, logits_slice)
        else:
            pos = positions if logits_slice is None else positions[:, logits_slice]
        target = torch.where(pos >= self.eos_at, EOS, (3 * pos) % 40)
        logits = torch.zeros(*pos.shape, 64)
        strength = 2.0 + (pos % 7).float()  # distinct confidences, no ties
        return logits.scatter(-1, target[..., None], strength[..., None])


TOKENS = TokenIds(mask=MASK, eos=EOS, pad=EOS, stop=(EOS,))


@pytest.mark.parametrize(
    "kw",
    [dict(policy="fixed"), dict(policy="fixed", steps=8), dict(policy="threshold", threshold=0.3),
     dict(policy="factor"), dict(policy="entropy", gamma=2.0), dict(policy="budget", budget=2.0)],
    ids=lambda k: k["policy"] + str(k.get("steps", "")),
)
def test_only_masks_change_and_commits_are_final(llada, kw):
    """From step to step: prompt columns never change, a committed token never changes, every
    step of an unfinished row commits at least one token, and the commits the request reports
    are the positions that changed."""
    seen = []
    model = llada.model
    orig = model.forward

    def spy(ids, *a, **k):
        seen.append(ids.clone())
        return orig(ids, *a, **k)

    model.forward = spy
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9]]
    try:
        params = GenerationParams(gen_length=16, block_length=8, early_stop=False, **kw).check()
        out = decode(model, llada.token_ids, prompts, params, watch=True)
    finally:
        del model.forward
    mask = llada.token_ids.mask
    for ids in seen:  # no cache: every forward is over each row's whole canvas, prompt first
        for r in range(ids.shape[0]) if ids.shape[0] == len(prompts) else ():
            assert ids[r, : len(prompts[r])].tolist() == prompts[r]
    assert not (out.generated == mask).any()
    for states, commits in zip(out.states, out.row_commits):
        states = [[mask] * 16] + states
        assert len(states) == len(commits) + 1
        for before, after, n in zip(states, states[1:], commits):
            assert all(b == a for b, a in zip(before, after) if b != mask)
            changed = sum(b != a for b, a in zip(before, after))
            assert changed == n >= 1
    assert [sum(c) for c in out.row_commits] == [16, 16]


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("policy", ["fixed", "threshold"])
def test_row_alone_equals_row_in_padded_batch(llada, cache, policy):
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6, 5], [2, 7, 1], [8, 2, 8, 1, 8, 2]]
    p = GenerationParams(gen_length=16, block_length=8, cache=cache, policy=policy, threshold=0.3)
    batch = llada.generate(prompts, p).results
    for prompt, row in zip(prompts, batch):
        alone = llada.generate([prompt], p).results[0]
        assert alone.raw_ids == row.raw_ids


@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("fixture", ["llada", "dream"])
def test_cache_with_refresh_every_step_equals_no_cache(request, cache, fixture):
    llm = request.getfixturevalue(fixture)
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]]
    base = GenerationParams(gen_length=16, block_length=8, policy="threshold", threshold=0.3)
    ref = llm.generate(prompts, base)
    out = llm.generate(prompts, GenerationParams(**{**base.__dict__, "cache": cache, "refresh_interval": 1}))
    assert [r.raw_ids for r in out.results] == [r.raw_ids for r in ref.results]
    assert all(s.refresh for s in out.steps)


@pytest.mark.parametrize("fixture", ["llada", "dream"])
def test_cached_modes_recompute_fewer_positions(request, fixture):
    llm = request.getfixturevalue(fixture)
    shift = llm.arch.logit_shift
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6]]
    p = dict(gen_length=32, block_length=8, early_stop=False)
    L = 8 + 32
    for cache in ("prefix", "dual"):
        out = llm.generate(prompts, GenerationParams(cache=cache, **p))
        block = -1
        for st in out.steps:
            block += st.refresh  # one row: each block starts with its refresh
            s = 8 + 8 * block
            expect = L if st.refresh else (L - s + shift if cache == "prefix" else 8 + shift)
            assert st.positions == expect
        assert sum(st.refresh for st in out.steps) == 4  # one refresh per block


def test_refresh_interval_is_independent_of_block_length(llada):
    p = GenerationParams(gen_length=32, block_length=16, cache="dual", refresh_interval=5, early_stop=False)
    out = llada.generate([[1, 2, 3]], p)
    assert len(out.steps) == 32  # one token per step, no early stop: 16 steps per block
    per_block = [[st.refresh for st in out.steps[16 * b : 16 * (b + 1)]] for b in (0, 1)]
    for flags in per_block:
        assert flags == [i % 5 == 0 for i in range(len(flags))]
        assert len(flags) == 16


def test_early_stop_finishes_row_and_saves_forwards():
    model = ScriptedModel(eos_at=8)  # rows of prompt length 3 hit EOS at generated position 5
    prompts = [[1, 2, 3], [1, 2, 3]]
    p = GenerationParams(gen_length=32, block_length=8).check()
    out = decode(model, TOKENS, prompts, p)
    gen = out.generated
    assert gen[0, :5].tolist() == [(3 * q) % 40 for q in range(3, 8)]
    assert gen[0, 5].item() == EOS
    assert out.nfe == 8  # only the first block: the rest is never computed
    full = decode(model, TOKENS, prompts, GenerationParams(gen_length=32, block_length=8, early_stop=False).check())
    assert full.nfe == 32 and torch.equal(full.generated[:, :6], gen[:, :6])


def test_finished_rows_leave_the_batch():
    model = ScriptedModel(eos_at=30)
    # row 1 (positions >= 30) predicts EOS everywhere and finishes inside block 0; row 0 runs to
    # generated position 27 (block 3)
    prompts = [[1, 2, 3], [5] * 30]
    p = GenerationParams(gen_length=32, block_length=8).check()
    out = decode(model, TOKENS, prompts, p)
    assert out.row_nfe[1] < 8
    assert out.row_nfe[0] == 32
    rows = [st.rows for st in out.steps]
    assert rows == [2] * out.row_nfe[1] + [1] * (32 - out.row_nfe[1])
    alone = decode(model, TOKENS, prompts[:1], p)
    assert torch.equal(alone.generated[0], out.generated[0])


def test_trace_counts(llada):
    out = llada.generate([[1, 2, 3]], GenerationParams(gen_length=16, block_length=8, policy="threshold",
                                                       threshold=0.2, early_stop=False))
    r = out.results[0]
    assert r.nfe == out.nfe == len(r.commits)
    assert sum(r.commits) == 16 == sum(st.committed for st in out.steps)
    assert all(st.seconds > 0 for st in out.steps)


@pytest.mark.parametrize("policy", ["entropy", "budget", "factor", "threshold"])
def test_parallel_policies_commit_several_tokens_per_step(policy):
    model = ScriptedModel()
    p = GenerationParams(gen_length=32, block_length=32, policy=policy, gamma=1.0, budget=3.0, factor=4.0,
                         threshold=0.5, early_stop=False).check()
    out = decode(model, TOKENS, [[1, 2, 3]], p)
    assert out.nfe < 32
    assert out.generated[0].tolist() == [(3 * q) % 40 for q in range(3, 35)]


def test_seeded_sampling_is_reproducible(llada):
    p = GenerationParams(gen_length=16, block_length=8, temperature=1.0, seed=7)
    a = llada.generate([[1, 2, 3]], p).results[0].raw_ids
    b = llada.generate([[1, 2, 3]], p).results[0].raw_ids
    c = llada.generate([[1, 2, 3]], GenerationParams(**{**p.__dict__, "seed": 8})).results[0].raw_ids
    assert a == b and a != c


@pytest.mark.parametrize("kw", [dict(confidence="margin"), dict(confidence="neg_entropy", policy="threshold", threshold=0.5),
                                dict(top_k=3, temperature=0.8, seed=1), dict(top_p=0.5, temperature=1.0, seed=2),
                                dict(policy="entropy", gamma=0.5, cache="dual"), dict(policy="budget", cache="prefix")])
def test_native_knobs_complete_the_canvas(llada, kw):
    out = llada.generate([[1, 2, 3], [4, 5]], GenerationParams(gen_length=16, block_length=8, early_stop=False, **kw))
    for r in out.results:
        assert llada.token_ids.mask not in r.raw_ids and sum(r.commits) == 16


def test_top_k_one_is_greedy(llada):
    greedy = llada.generate([[1, 2, 3]], GenerationParams(gen_length=16, block_length=8)).results[0].raw_ids
    top1 = llada.generate([[1, 2, 3]], GenerationParams(gen_length=16, block_length=8, top_k=1, temperature=1.0,
                                                        seed=3)).results[0].raw_ids
    assert greedy == top1


def test_bfloat16_weights_decode(llada_dir):
    from unmask import LLM

    llm = LLM(llada_dir, dtype="bfloat16")
    out = llm.generate([[1, 2, 3]], GenerationParams(gen_length=16, block_length=8, cache="dual", early_stop=False))
    assert llm.token_ids.mask not in out.results[0].raw_ids
