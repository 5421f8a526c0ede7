"""Holes decoded at several lengths, the fill most like the others kept (hole_length "consensus";
engine/consensus.py): the grid, the choice, the engine against the same exact holes decoded one by
one, what a stream sees, abort, the server's infill endpoint, and the refusals."""

import json

import pytest

from unmask import GenerationParams, UnmaskError
from unmask.engine import Engine, EngineConfig
from unmask.engine.consensus import choose, lengths
from unmask.sampler.stops import first_stop_index

P = dict(gen_length=12, block_length=12, steps=12)


def test_lengths_spread_geometrically_from_least_to_the_bound():
    assert lengths(24, 10) == [3, 4, 5, 6, 8, 10, 12, 15, 19, 24]
    assert lengths(64, 8) == [8, 11, 14, 20, 26, 35, 48, 64]
    assert lengths(8, 10) == [1, 2, 3, 4, 5, 6, 7, 8] and lengths(5, 1) == [5] and lengths(3, 4, least=9) == [3]
    assert lengths(64, 4, least=40) == [40, 47, 55, 64]
    for bound in range(1, 70, 3):
        for k in range(1, 18):
            for least in (0, 1, 4, 30):
                g = lengths(bound, k, least)
                assert g == sorted(set(g)) and len(g) <= k and g[-1] == bound
                assert g[0] == (bound if k == 1 else max(1, min(max(least, -(-bound // 8)), bound)))


def test_the_choice_is_the_answer_most_like_the_others():
    assert choose([[5], [1, 2, 3], [1, 2, 3], [1, 2]]) == 1
    assert choose([[1, 2, 3], [1, 2, 3, 4], [9]]) == 0  # a tie goes to the shorter length
    assert choose([[7]]) == 0


def _text(ids, stop):
    k = first_stop_index(ids, stop)
    return ids if k is None else ids[:k]


def test_consensus_is_the_choice_among_exact_holes_decoded_one_by_one(llada):
    """Three rows of different prompt and suffix lengths (and a row without a hole beside them):
    each consensus hole is the exact hole, at one of its candidate lengths, that `choose` keeps among
    those same holes decoded separately; the row without a hole decodes as it does alone."""
    prompts, suffixes = [[3, 4, 5], [6, 7], [8, 9, 10, 11, 12]], [[20, 21], [22, 23, 24, 25], [26]]
    p = GenerationParams(**P, hole_length="consensus", hole_candidates=5)
    out = llada._generate_engine(prompts + [[13, 14]], [llada.accept(p)] * 3 + [llada.accept(GenerationParams(**P))],
                                 suffixes + [[]]).results
    stop = set(llada.token_ids.stop)
    for r in range(3):
        each = [llada.generate([prompts[r]], GenerationParams(gen_length=n, block_length=n, steps=n,
                                                              hole_length="exact"), suffix=[suffixes[r]]).results[0]
                for n in lengths(12, 5)]
        k = choose([_text(e.raw_ids, stop) for e in each])
        assert out[r].token_ids == each[k].token_ids and out[r].text == each[k].text
        assert out[r].nfe == max(e.nfe for e in each)  # the forwards it waited for (its candidates run together)
    alone = llada.generate([[13, 14]], GenerationParams(**P)).results[0]
    assert out[3].token_ids == alone.token_ids


def test_a_consensus_request_streams_its_answer_once_and_abort_frees_its_rows(llada):
    engine = Engine(llada.model, llada.token_ids, EngineConfig())
    p = GenerationParams(**P, hole_length="consensus", hole_candidates=4, seed=3, temperature=0.7)
    req = engine.add_request([3, 4, 5], p, suffix=[20, 21])
    plain = engine.add_request([6, 7], GenerationParams(**P))
    assert engine.num_waiting == 5 and len(engine.requests) == 2
    seen = []
    while engine.has_unfinished():
        seen += [o for o in engine.step() if o.request is req]
    assert len(seen) == 1 and seen[0].finished and req.done and plain.done
    assert seen[0].new_ids == req.canvas[: seen[0].committed] and req.nfe == 12
    assert not engine.consensus.of and not engine.consensus.groups and not engine.generators
    again = engine.add_request([3, 4, 5], p, suffix=[20, 21], request_id="b")
    engine.step()
    assert engine.num_running == 4  # lengths 2, 4, 7, 12 (from an eighth of the bound)
    assert engine.abort("b") and again.finish_reason == "abort" and engine.num_running == 0
    assert not engine.has_unfinished() and not engine.consensus.of and not engine.generators
    again2 = engine.add_request([3, 4, 5], p, suffix=[20, 21], request_id="c")  # aborted before it ran
    assert engine.abort("c") and again2.done and engine.num_waiting == 0


def test_a_watched_consensus_request_shows_its_longest_candidate_then_the_answer(llada):
    """The playground's view: each step the whole hole at the bound (its longest candidate's
    canvas, nothing committed to the answer yet), and at the end the kept candidate's canvas."""
    engine = Engine(llada.model, llada.token_ids, EngineConfig())
    p = GenerationParams(**P, hole_length="consensus", hole_candidates=4)
    req = engine.add_request([3, 4, 5], p, suffix=[20, 21], watch=True)
    seen = []
    while engine.has_unfinished():
        seen += [o for o in engine.step() if o.request is req]
    *steps, last = seen
    assert len(steps) == 11 and all(len(o.canvas) == 12 and o.committed == 0 and not o.new_ids for o in steps)
    assert sum(o.canvas.count(llada.token_ids.mask) for o in steps[:1]) == 11  # one token a step
    assert last.finished and last.canvas == req.canvas and last.new_ids == req.canvas[: last.committed]
    plain = llada._generate_engine([[3, 4, 5]], llada.accept(p), [[20, 21]]).results[0]
    assert plain.raw_ids == req.canvas  # watching changes nothing


def test_a_template_decodes_each_hole_by_consensus(llada):
    """Several holes take consensus one after another (the bounded holes' rounds): hole by hole,
    the same text as one hole with the template's text around it."""
    t = "w1 w2 <|hole:8|> w3 w4 <|hole:8|> w5"
    p = dict(gen_length=8, block_length=8, steps=8, hole_length="consensus", hole_candidates=4)
    got = llada.infill([t], p).results[0]
    assert len(got.holes) == 2
    first = llada.generate(["w1 w2 "], p, suffix=" w3 w4 ", chat=False).results[0]
    assert got.holes[0] == first.text and got.nfe > first.nfe


def test_consensus_refusals_name_the_setting(llada, embedded_ar_code):
    p = GenerationParams(**P, hole_length="consensus")
    engine = Engine(llada.model, llada.token_ids, EngineConfig(), tokenizer=llada.tokenizer)
    with pytest.raises(UnmaskError, match="logprobs") as e:
        engine.add_request([3, 4], p, suffix=[20], logprobs=1)
    assert e.value.param == "hole_length"
    with pytest.raises(UnmaskError, match="one by one") as e:
        engine.add_request([3, 4], GenerationParams(**P, hole_length="consensus"), suffix=[20],
                           fill=[llada.token_ids.mask] * 4 + [9] + [llada.token_ids.mask] * 7)
    assert e.value.param == "hole_length"
    assert not engine.consensus.groups and engine.num_waiting == 0  # nothing half-added
    with pytest.raises(UnmaskError, match="hole_length 'consensus'"):
        llada.generate([[1, 2]], GenerationParams(**P, hole_length="consensus", compat="llada"), suffix=[[3, 4]])
    with pytest.raises(UnmaskError, match="autoregressive") as e:
        embedded_ar_code.generate(["def f():\n"], dict(gen_length=8, hole_length="consensus"), suffix="    return 1\n")
    assert e.value.param == "hole_length"
    with pytest.raises(UnmaskError, match="hole_candidates"):
        GenerationParams(**P, hole_length="consensus", hole_candidates=0)
    small = Engine(llada.model, llada.token_ids, EngineConfig(max_waiting=3))
    with pytest.raises(UnmaskError, match="queue is full"):
        small.add_request([3, 4], GenerationParams(**P, hole_length="consensus", hole_candidates=4), suffix=[20])
    assert not small.consensus.groups and small.num_waiting == 0


def test_fim_endpoint_stream_and_playground_take_a_consensus_hole(embedded):
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from test_server import Server

    prefix, suffix = "json : color green score 6 5 name liz", '"score" : 6 5 , "name" : "liz" }'
    want = embedded.generate([prefix], embedded.default_params(gen_length=8, hole_length="consensus"),
                             suffix=suffix).results[0].text
    s = Server(embedded, served_model_name="default")
    try:
        body = {"model": "default", "prompt": prefix, "suffix": suffix, "max_tokens": 8, "hole_length": "consensus"}
        r = httpx.post(s.url + "/v1/fim/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == want
        with httpx.stream("POST", s.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as st:
            chunks = [ln for ln in st.iter_lines() if ln.startswith("data: {")]
        assert "".join(json.loads(c[6:])["choices"][0]["text"] for c in chunks) == want
        r = httpx.post(s.url + "/v1/completions", json={**body, "stream": True, "diffusing": True}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "diffusing"
        with httpx.stream("POST", s.url + "/playground/stream", json=body, timeout=60) as st:  # the playground
            events = [json.loads(ln[6:]) for ln in st.iter_lines() if ln.startswith("data: ")]
        assert events[-1]["type"] == "done" and events[-1]["text"] == want
        assert all(len(e["cells"]) == 8 for e in events[:-2] if e["type"] == "step")
    finally:
        s.stop()
