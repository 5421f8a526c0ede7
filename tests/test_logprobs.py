"""logprobs in the engine: each reported token's log-probability and the most likely tokens',
for every row kind (engine/logprobs.py, sampler/logprobs.py)."""

import math

import pytest
import torch

from unmask import LLM
from unmask.errors import UnmaskError
from unmask.sampler.logprobs import TOP_LOGPROBS

PROMPTS = ["copy : red 4 owl", "json : name bob age 3 4 city rome", "sort : 7 4 0 9", "pick hand red cat sun :"]


def _run(engine, reqs_of):
    """Step until done; per request id: (its streamed ids, its streamed logprob entries)."""
    out = {}
    while engine.has_unfinished():
        for o in engine.step():
            ids, lps = out.setdefault(o.request.id, ([], []))
            ids += o.new_ids
            if o.logprobs is not None:
                assert len(o.logprobs) == len(o.new_ids)  # one entry per new id, in the same step
                lps += o.logprobs
            else:
                assert o.request.logprobs is None
    return out


def _check_entries(ids, entries, k):
    """Each entry: a finite logprob <= 0, the k most likely tokens in descending order, and the
    chosen token's logprob at most the most likely one's (equal when it is in the list)."""
    assert len(entries) == len(ids)
    for t, (lp, top) in zip(ids, entries):
        assert math.isfinite(lp) and lp <= 1e-6
        assert len(top) == k
        assert all(a[1] >= b[1] for a, b in zip(top, top[1:]))
        if top:
            assert lp <= top[0][1] + 1e-5
            assert all(abs(v - lp) < 1e-5 for i, v in top if i == t)


def test_the_ar_twin_reports_the_usual_logprobs(embedded_ar):
    """The AR twin's logprobs are the usual ones: log softmax of a plain forward over the prompt
    and the answer (no cache) at each answer position; greedy, so the chosen token is the most
    likely one. A request without logprobs decodes the same tokens beside it."""
    ar = embedded_ar
    ids = ar.encode(PROMPTS, chat=False)
    engine = ar.engine()
    reqs = [engine.add_request(i, ar.default_params(gen_length=16), logprobs=3) for i in ids]
    plain = engine.add_request(ids[0], ar.default_params(gen_length=16))
    got = _run(engine, reqs)
    assert got[plain.id][0] == got[reqs[0].id][0]
    for prompt, req in zip(ids, reqs):
        answer, entries = got[req.id]
        _check_entries(answer, entries, 3)
        x = torch.tensor([prompt + answer])
        with torch.inference_mode():
            logits = ar.model(x, torch.arange(x.shape[1])[None])[0]
        want = torch.log_softmax(logits.float(), -1)[len(prompt) - 1 : len(prompt) - 1 + len(answer)]
        want = want.gather(-1, torch.tensor(answer)[:, None])[:, 0]
        assert torch.allclose(torch.tensor([lp for lp, _ in entries]), want, atol=1e-4)
        assert [top[0][0] for _, top in entries] == answer


@pytest.mark.parametrize("fixture", ["embedded", "embedded_block"])
def test_masked_rows_report_commit_time_probabilities(request, fixture):
    """Masked and block rows: the probability at the forward that committed the token. Under the
    threshold policy every committed token's probability clears the threshold, but the one a
    step must commit when none does (the most likely of the block); greedy, so it is the most
    likely token of its forward. Logprobs change no token, and a row's logprobs do not depend on
    the rows beside it."""
    llm = request.getfixturevalue(fixture)
    ids = llm.encode(PROMPTS, chat=False)
    params = llm.default_params(gen_length=32, policy="threshold", threshold=0.7)
    engine = llm.engine()
    reqs = [engine.add_request(i, params, logprobs=2) for i in ids]
    plain = [engine.add_request(i, params) for i in ids]
    got = _run(engine, reqs)
    below = 0
    for req, p in zip(reqs, plain):
        answer, entries = got[req.id]
        assert answer == got[p.id][0] and answer
        _check_entries(answer, entries, 2)
        assert [top[0][0] for _, top in entries] == answer
        below += sum(math.exp(lp) < 0.7 for lp, _ in entries)
    total = sum(len(got[q.id][0]) for q in reqs)
    assert below < total  # most tokens cleared the threshold (the forced ones did not)
    alone = llm.engine()
    one = alone.add_request(ids[1], params, logprobs=2)
    solo = _run(alone, [one])[one.id]
    assert solo[0] == got[reqs[1].id][0]
    assert torch.allclose(torch.tensor([lp for lp, _ in solo[1]]), torch.tensor([lp for lp, _ in got[reqs[1].id][1]]),
                          atol=1e-4)


def test_a_revising_policy_scores_the_token_that_stays(embedded):
    """Token editing replaces committed tokens: the reported logprob is the one of the token the
    answer ends with, scored at the forward that wrote it (the most likely one there, greedy)."""
    llm = embedded
    ids = llm.encode(PROMPTS, chat=False)
    params = llm.default_params(gen_length=32, policy="edit")
    engine = llm.engine()
    reqs = [engine.add_request(i, params, logprobs=1) for i in ids]
    got = _run(engine, reqs)
    assert sum(r.counters()["edits"] for r in reqs) > 0
    for req in reqs:
        answer, entries = got[req.id]
        _check_entries(answer, entries, 1)
        assert [top[0][0] for _, top in entries] == answer


def test_speculative_rows_report_the_targets_logprobs(embedded_ar):
    """A drafter's accepted tokens are scored by the target's verifying forward: the same
    logprobs as the target decoding alone (the AR twin), whatever the drafter proposed."""
    from test_speculative import _random_drafter

    ar = embedded_ar
    spec = LLM.from_parts(ar.model, ar.tokenizer, ar.token_ids, drafter=_random_drafter(ar.model, block=4))
    ids = ar.encode(PROMPTS, chat=False)
    e1, e2 = ar.engine(), spec.engine()
    a = [e1.add_request(i, ar.default_params(gen_length=16), logprobs=4) for i in ids]
    b = [e2.add_request(i, spec.default_params(gen_length=16), logprobs=4) for i in ids]
    ga, gb = _run(e1, a), _run(e2, b)
    for x, y in zip(a, b):
        assert ga[x.id][0] == gb[y.id][0]
        _check_entries(*gb[y.id], 4)
        la, lb = ga[x.id][1], gb[y.id][1]
        assert torch.allclose(torch.tensor([v for v, _ in la]), torch.tensor([v for v, _ in lb]), atol=1e-4)
        assert [[i for i, _ in t] for _, t in la] == [[i for i, _ in t] for _, t in lb]


def test_the_engine_refuses_bad_logprobs(embedded):
    llm = embedded
    engine = llm.engine()
    ids = llm.encode(PROMPTS[:1], chat=False)[0]
    for bad in (-1, TOP_LOGPROBS + 1, "3", True, 2.0):
        with pytest.raises(UnmaskError, match="logprobs"):
            engine.add_request(ids, llm.default_params(gen_length=32), logprobs=bad)
    assert not engine.has_unfinished()


def test_renoising_rows_score_the_canvas_they_commit(tmp_path):
    """A renoising row's committed canvas is the argmax of the sampler's last step: each token's
    logprob is the most likely one's there. Seeded, logprobs change no token."""
    pytest.importorskip("transformers", minversion="5.24")
    import warnings

    from checkpoints import write_diffusion_gemma

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dg = LLM(write_diffusion_gemma(tmp_path))
    prompts = [[2, 5, 7, 9], [2, 11, 3]]
    engine = dg.engine()
    reqs = [engine.add_request(p, dg.default_params(gen_length=40, seed=s), logprobs=3) for s, p in enumerate(prompts)]
    plain = [engine.add_request(p, dg.default_params(gen_length=40, seed=s)) for s, p in enumerate(prompts)]
    got = _run(engine, reqs)
    for req, p in zip(reqs, plain):
        answer, entries = got[req.id]
        assert answer == got[p.id][0] and answer
        _check_entries(answer, entries, 3)
        assert [top[0][0] for _, top in entries] == answer


def test_llm_generate_returns_each_tokens_logprobs(embedded):
    """Offline: GenerationResult.logprobs, one entry per token of token_ids (the end of text
    not), the same as the engine streams; a reference (compat) mode refuses them by name."""
    llm = embedded
    out = llm.generate(PROMPTS, {"gen_length": 32}, chat=False, logprobs=2)
    plain = llm.generate(PROMPTS, {"gen_length": 32}, chat=False)
    for r, p in zip(out.results, plain.results):
        assert r.token_ids == p.token_ids and p.logprobs is None
        _check_entries(r.token_ids, r.logprobs, 2)
    engine = llm.engine()
    req = engine.add_request(llm.encode(PROMPTS[:1], chat=False)[0], llm.params_for({"gen_length": 32}), logprobs=2)
    streamed = _run(engine, [req])[req.id][1]
    got = out.results[0].logprobs
    assert len(got) == len(out.results[0].token_ids) and len(streamed) >= len(got)
    for (a, ta), (b, tb) in zip(got, streamed):  # in a batch of 4 and alone: equal to float noise
        assert a == pytest.approx(b, abs=1e-4) and [i for i, _ in ta] == [i for i, _ in tb]
    with pytest.raises(UnmaskError, match="compat"):
        llm.generate(PROMPTS[:1], {"gen_length": 32, "compat": "llada"}, chat=False, logprobs=1)
