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
        assert q.edits == a.edits


def _spy(monkeypatch):
    calls = []
    revise = EditPolicy.revise

    def spy(self, prob, tokens, current, editable, committed, step, generator):
        edit, remask = revise(self, prob, tokens, current, editable, committed, step, generator)
        calls.append((prob, tokens, current, editable, edit, self.edit_threshold))
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
        assert alone.raw_ids == q.canvas and alone.edits == q.edits


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
