"""Token editing as a commit policy (`policy edit`): the invariants of revising committed tokens,
and the native engine against LLaDA2.1's own block generation."""

import pytest
import torch

from checkpoints import write_llada2
from unmask import LLM, GenerationParams, UnmaskError
from unmask.params import resolve_params
from unmask.sampler.policy import EditPolicy

PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6, 5], [2, 7, 1], [8, 2, 8, 1, 8, 2], [1, 4, 1, 4, 2], [5, 5], [9, 8, 7, 6]]


@pytest.fixture(scope="module")
def llada2(tmp_path_factory):
    return LLM(write_llada2(tmp_path_factory.mktemp("llada2") / "m", bd_size=8))


@pytest.mark.parametrize("thr,edit,post", [(0.9, 1.0, 16), (0.5, 0.5, 16), (0.3, 0.2, 2), (0.7, 0.4, 0), (0.5, 0.1, 16)])
@pytest.mark.parametrize("cache", ["none", "exact"])
def test_native_edit_policy_is_llada2_1s_generate(llada2, thr, edit, post, cache):
    """Where a row's canvas ends on a block boundary (upstream decodes whole blocks), the engine's
    edit policy on a block model, cached or not, takes LLaDA2.1's tokens in LLaDA2.1's forwards
    (compat llada2, itself checked against the recorded reference)."""
    prompts = [[3, 4, 5], [6, 7, 8, 9, 10, 11, 12], [13] * 9, [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]]
    ref = llada2.generate(prompts, GenerationParams(compat="llada2", gen_length=24, block_length=8, threshold=thr,
                                                    edit_threshold=edit, max_post_steps=post))
    engine = llada2.engine()
    reqs = [engine.add_request(p, GenerationParams(policy="edit", gen_length=24 + (-(len(p) + 24)) % 8, block_length=8,
                                                   threshold=thr, edit_threshold=edit, max_post_steps=post,
                                                   cache=cache).check(8)) for p in prompts]
    while engine.has_unfinished():
        engine.step()
    for a, q in zip(ref.results, reqs):
        assert q.canvas[: len(a.raw_ids)][:24] == a.raw_ids[:24] and q.nfe == a.nfe
        assert q.stats.edits == a.edits


def _spy(monkeypatch):
    calls = []
    revise = EditPolicy.revise

    def spy(self, r):
        edit, remask = revise(self, r)
        calls.append((r.prob, r.tokens, r.current, r.editable, edit, self.edit_threshold))
        return edit, remask

    monkeypatch.setattr(EditPolicy, "revise", spy)
    return calls


@pytest.mark.parametrize("fixture,kw", [
    ("embedded_block", dict(gen_length=24, block_length=8, cache="exact")),
    ("embedded_block", dict(gen_length=24, block_length=4, cache="exact-dual")),
    ("llada", dict(gen_length=16, block_length=8, cache="dual")),
    ("llada", dict(gen_length=16, block_length=4, cache="prefix")),
    ("dream", dict(gen_length=16, block_length=8, cache="none")),
])
def test_edit_invariants(request, monkeypatch, fixture, kw):
    """The prompt is never edited; an edit replaces a committed token by a different one whose
    probability is above the edit threshold; streamed text is never revised; every row finishes
    within blocks x (block + post steps + 1) forwards; greedy output does not depend on the batch."""
    llm = request.getfixturevalue(fixture)
    calls = _spy(monkeypatch)
    params = GenerationParams(policy="edit", threshold=0.5, edit_threshold=0.05, max_post_steps=3, **kw).check(
        llm.arch.block_size)
    prompts = [llm.encode(t)[0] for t in ("copy : red 4 owl", "sort : 7 4 0", "reverse : sun 3 cat tree")] \
        if fixture == "embedded_block" else PROMPTS[:3]
    engine = llm.engine()
    reqs = [engine.add_request(p, params) for p in prompts]
    streamed = {q.id: [] for q in reqs}
    while engine.has_unfinished():
        for out in engine.step():
            streamed[out.request.id] += out.new_ids
        for i, req in enumerate(engine.rows.reqs):  # the prompt columns of every running row are the prompt
            assert engine.rows.x[i, : len(req.prompt)].tolist() == req.prompt
    assert calls and (fixture == "embedded_block" or sum(int(c[4].sum()) for c in calls) > 0)  # edits happened
    for prob, tokens, current, editable, edit, thr in calls:
        assert not (edit & ~editable).any()
        assert (current[editable] != llm.token_ids.mask).all()
        assert (tokens[edit] != current[edit]).all() and (prob[edit] > thr).all()
    blocks = -(-params.gen_length // params.block_length) + 1
    for q, p in zip(reqs, prompts):
        assert q.nfe <= blocks * (params.block_length + params.max_post_steps + 1)
        assert q.canvas[: len(streamed[q.id])] == streamed[q.id]
        alone = llm.generate([p], params).results[0]
        assert alone.raw_ids == q.canvas and alone.edits == q.stats.edits


def test_editing_off_is_the_threshold_policy(llada):
    """edit_threshold 1 (nothing passes) and no post steps: the threshold policy, token for token."""
    a = llada.generate(PROMPTS, GenerationParams(policy="edit", threshold=0.4, edit_threshold=1.0, max_post_steps=0,
                                                 gen_length=16, block_length=8, cache="dual"))
    b = llada.generate(PROMPTS, GenerationParams(policy="threshold", threshold=0.4, gen_length=16, block_length=8,
                                                 cache="dual"))
    assert [r.raw_ids for r in a.results] == [r.raw_ids for r in b.results]
    assert [r.nfe for r in a.results] == [r.nfe for r in b.results]
    assert all(s.edits == 0 for s in a.steps)


def test_edit_knobs(llada):
    assert resolve_params({"edit_threshold": 0.5}).policy == "edit"  # the knob names the policy
    p = resolve_params({"edit_threshold": 0.5, "threshold": 0.7})  # edit reads the threshold too
    assert (p.policy, p.threshold) == ("edit", 0.7)
    assert resolve_params({"max_post_steps": 4}).policy == "edit"
    with pytest.raises(UnmaskError, match="max_post_steps applies to policy edit, not to policy threshold"):
        resolve_params({"max_post_steps": 4, "policy": "threshold"})
    for bad, msg in (({"edit_threshold": 1.5}, r"edit_threshold 1.5 is outside \(0, 1\]"),
                     ({"max_post_steps": -1}, "max_post_steps -1 must be a non-negative integer")):
        with pytest.raises(UnmaskError, match=msg):
            resolve_params(bad)
    out = llada.generate(PROMPTS[:2], {"edit_threshold": 0.05, "gen_length": 16, "block_length": 8})
    assert sum(r.edits for r in out.results) == sum(s.edits for s in out.steps) > 0  # counted in results and trace


# ---------------------------------------------------------------- ReMDM remasking

def test_remdm_sigma_follows_its_strategies():
    from unmask.sampler.policy import ReMDMPolicy, Revision

    B, W = 3, 5
    editable = torch.tensor([[True, True, False, True, True]] * B)
    step, steps = torch.tensor([1, 2, 3]), torch.tensor([4, 4, 4])
    conf = torch.tensor([[0.9, 0.2, 0.0, 0.5, 0.99]] * B)
    u = torch.full((B, W), 0.5)
    base = dict(prob=torch.rand(B, W), tokens=torch.zeros(B, W, dtype=torch.long), current=torch.zeros(B, W, dtype=torch.long),
                editable=editable, committed=torch.zeros(B, W, dtype=torch.bool), step=step, steps=steps,
                commit_conf=conf)
    sigma_max = torch.tensor([min(1.0, (1 - 2 / 4) / (1 / 4)), min(1.0, (1 - 3 / 4) / (2 / 4)), 0.0])  # 1, 0.5, 0
    for strategy, eta, want in (("cap", 0.6, sigma_max.clamp(max=0.6)), ("rescale", 0.6, 0.6 * sigma_max)):
        for lo in (0.0, 0.999):  # a draw below sigma remasks, one above does not
            rev = Revision(**base, uniform=(want[:, None] - 1e-4 if lo == 0.0 else want[:, None] + 1e-4).expand(B, W).clamp(0, 1))
            _, rm = ReMDMPolicy(eta, strategy).revise(rev)
            expect = editable & (want[:, None] > 0) if lo == 0.0 else torch.zeros_like(editable)
            assert torch.equal(rm, expect), (strategy, lo)
    _, rm = ReMDMPolicy(0.5, "conf").revise(Revision(**base, uniform=torch.full((B, W), 0.2)))
    w = torch.softmax(torch.tensor([-0.9, -0.2, -0.5, -0.99]), 0)  # the least confident token is likeliest
    assert rm[0].tolist() == [bool(x) for x in [w[0] > 0.2, w[1] > 0.2, False, w[2] > 0.2, w[3] > 0.2]]
    assert not rm[2].any()  # the block's last step remasks nothing


@pytest.mark.parametrize("fixture,kw", [
    ("llada", dict(gen_length=16, block_length=8, steps=8, cache="dual")),
    ("embedded_block", dict(gen_length=24, block_length=8, steps=12, cache="exact")),
])
def test_remdm_remasks_inside_the_open_block_and_finishes(request, fixture, kw):
    llm = request.getfixturevalue(fixture)
    params = GenerationParams(policy="remdm", remask_eta=0.5, seed=3, **kw).check(llm.arch.block_size)
    prompts = PROMPTS[:4] if fixture == "llada" else [llm.encode(t)[0] for t in ("copy : red 4 owl", "sort : 7 4 0")]
    engine = llm.engine()
    reqs = [engine.add_request(p, params) for p in prompts]
    streamed = {q.id: [] for q in reqs}
    while engine.has_unfinished():
        for out in engine.step():
            streamed[out.request.id] += out.new_ids
        for i, req in enumerate(engine.rows.reqs):
            assert engine.rows.x[i, : len(req.prompt)].tolist() == req.prompt
    assert sum(q.stats.remasked for q in reqs) > 0
    blocks = -(-params.gen_length // params.block_length) + 1
    for q, p in zip(reqs, prompts):
        assert q.finish_reason in ("stop", "length") and q.nfe <= blocks * (params.steps_per_block + 1)
        assert llm.token_ids.mask not in q.canvas[: len(streamed[q.id])]
        assert q.canvas[: len(streamed[q.id])] == streamed[q.id]
        again = llm.generate([p], params).results[0]  # a seeded row draws alone: the batch does not matter
        assert again.raw_ids == q.canvas and again.remasked == q.stats.remasked
