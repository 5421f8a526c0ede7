"""The request-level engine: continuous batching, abort, per-request settings, token budget,
committed-prefix streaming, and batch invariance (a request's greedy output does not depend on
what else runs)."""

import pytest
import torch

from unmask import GenerationParams, UnmaskError
from unmask.engine.engine import EngineConfig, Status

SETTINGS = [
    dict(gen_length=16, block_length=8, policy="threshold", threshold=0.3, cache="dual"),
    dict(gen_length=16, block_length=16, policy="fixed", steps=8),
    dict(gen_length=24, block_length=8, policy="entropy", gamma=0.5, cache="prefix"),
    dict(gen_length=12, block_length=4, policy="budget", budget=2.0),
    dict(gen_length=16, block_length=8, policy="fixed", cache="dual", refresh_interval=2),
    dict(gen_length=16, block_length=8, policy="factor", factor=2.0, early_stop=False),
    dict(gen_length=16, block_length=8, policy="threshold", threshold=0.3, cache="adaptive", refresh_below=0.6),
    dict(gen_length=24, block_length=8, policy="fixed", steps=12, cache="adaptive", refresh_tokens=3,
         refresh_below=0.5, refresh_scope="canvas", early_stop=False),
]
PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6, 5], [2, 7, 1], [8, 2, 8, 1, 8, 2], [1, 4, 1, 4, 2], [5, 5], [9, 8, 7, 6],
           [4, 4, 2, 1], [7, 3, 3, 9, 1, 2]]


def _alone(llm, prompt, kw):
    return llm.generate([prompt], GenerationParams(**kw)).results[0].raw_ids


def _run(engine, max_steps=500):
    outs = []
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return outs
        outs += engine.step()
    raise AssertionError("the engine did not finish")


@pytest.mark.parametrize("fixture", ["llada", "dream"])
def test_mixed_settings_in_one_batch_equal_each_alone(request, fixture):
    """Rows with different policies, caches, block and generation lengths share every forward,
    and each row's tokens equal the same request decoded alone."""
    llm = request.getfixturevalue(fixture)
    engine = llm.engine()
    reqs = [engine.add_request(p, GenerationParams(**kw).check()) for p, kw in zip(PROMPTS, SETTINGS)]
    _run(engine)
    for req, p, kw in zip(reqs, PROMPTS, SETTINGS):
        assert req.status == Status.FINISHED
        assert req.canvas == _alone(llm, p, kw), kw


def test_a_request_joins_a_running_batch_at_the_next_step(llada):
    engine = llada.engine()
    kw = SETTINGS[1]
    first = engine.add_request(PROMPTS[0], GenerationParams(**kw).check())
    engine.step()
    engine.step()
    late = engine.add_request(PROMPTS[1], GenerationParams(**SETTINGS[0]).check())
    engine.step()
    assert late.status == Status.RUNNING and late.nfe == 1 and first.nfe == 3  # no waiting for a drain
    _run(engine)
    assert first.canvas == _alone(llada, PROMPTS[0], kw)
    assert late.canvas == _alone(llada, PROMPTS[1], SETTINGS[0])


def test_abort_frees_the_rows_and_leaves_others_unchanged(llada):
    engine = llada.engine()
    reqs = [engine.add_request(p, GenerationParams(**SETTINGS[1]).check()) for p in PROMPTS[:3]]
    engine.step()
    assert engine.abort(reqs[1].id) and not engine.abort(reqs[1].id)
    assert reqs[1].status == Status.ABORTED and reqs[1].finish_reason == "abort"
    assert engine.num_running == 2
    _run(engine)
    assert engine.num_running == 0 and engine.rows.k is None  # the KV rows are freed with the last request
    for i in (0, 2):
        assert reqs[i].canvas == _alone(llada, PROMPTS[i], SETTINGS[1])
    waiting = engine.add_request(PROMPTS[0], GenerationParams(**SETTINGS[1]).check())
    assert engine.abort(waiting.id) and engine.num_waiting == 0


def test_max_num_seqs_queues_the_rest(llada):
    engine = llada.engine(EngineConfig(max_num_seqs=2, max_waiting=3))
    reqs = [engine.add_request(p, GenerationParams(**SETTINGS[1]).check()) for p in PROMPTS[:3]]
    engine.step()
    assert engine.num_running == 2 and engine.num_waiting == 1
    reqs += [engine.add_request(p, GenerationParams(**SETTINGS[1]).check()) for p in PROMPTS[3:5]]
    with pytest.raises(UnmaskError, match="queue is full"):
        engine.add_request(PROMPTS[5], GenerationParams(**SETTINGS[1]).check())
    _run(engine)
    assert all(r.status == Status.FINISHED for r in reqs)
    assert reqs[3].canvas == _alone(llada, PROMPTS[3], SETTINGS[1])


def test_token_budget_runs_cached_steps_first_and_defers_the_rest(llada):
    """With a budget smaller than two refreshes, a long refresh waits a step while cached
    (window) steps of running rows go ahead; every request still finishes as alone."""
    kw = dict(gen_length=16, block_length=4, policy="fixed", steps=16, cache="dual")
    engine = llada.engine(EngineConfig(max_num_batched_tokens=30))
    a = engine.add_request(PROMPTS[0], GenerationParams(**kw).check())  # canvas 25: a refresh costs 25
    engine.step()
    b = engine.add_request(PROMPTS[2], GenerationParams(**kw).check())  # refresh 22, does not fit beside a's
    engine.step()
    assert a.nfe == 2 and b.nfe == 1  # a's cached step (4) and b's refresh (22) fit in 30 together
    _run(engine)
    assert a.canvas == _alone(llada, PROMPTS[0], kw) and b.canvas == _alone(llada, PROMPTS[2], kw)
    assert all(f.rows * f.positions <= 30 or f.rows == 1 for f in engine.trace)


def test_committed_prefix_streams_monotonically(llada):
    engine = llada.engine()
    req = engine.add_request(PROMPTS[0], GenerationParams(**SETTINGS[2]).check())
    streamed = []
    for out in _run(engine):
        assert out.committed == len(streamed) + len(out.new_ids)
        streamed += out.new_ids
    assert streamed == req.canvas[: len(streamed)]
    assert llada.token_ids.mask not in streamed
    assert req.first_commit is not None and req.finished >= req.first_commit


def test_seeded_sampling_is_per_request(llada):
    """A sampled request draws from its own generator: the same seed gives the same tokens alone
    or beside other requests."""
    kw = dict(gen_length=16, block_length=8, temperature=1.0, seed=11)
    engine = llada.engine()
    req = engine.add_request(PROMPTS[0], GenerationParams(**kw).check())
    engine.add_request(PROMPTS[1], GenerationParams(**{**kw, "seed": 3}).check())
    engine.add_request(PROMPTS[2], GenerationParams(**SETTINGS[0]).check())
    _run(engine)
    assert req.canvas == _alone(llada, PROMPTS[0], kw)


def test_engine_refuses_what_it_does_not_serve(llada):
    engine = llada.engine()
    with pytest.raises(UnmaskError, match="compat 'llada' runs as its own batch"):
        engine.add_request([1, 2], GenerationParams(compat="llada").check())
    engine.add_request([1, 2], GenerationParams(gen_length=8, block_length=8).check(), request_id="x")
    with pytest.raises(UnmaskError, match="request id 'x' is in use"):
        engine.add_request([1, 2], GenerationParams(gen_length=8, block_length=8).check(), request_id="x")
    with pytest.raises(UnmaskError, match="max_num_seqs 0"):
        EngineConfig(max_num_seqs=0)
    with pytest.raises(UnmaskError, match="scheduling 'fifo'"):
        EngineConfig(scheduling="fifo")


def test_release_forgets_finished_requests(llada):
    engine = llada.engine()
    req = engine.add_request(PROMPTS[0], GenerationParams(**SETTINGS[0]).check())
    _run(engine)
    engine.release(req.id)
    assert req.id not in engine.requests


def test_many_requests_leave_no_state_behind(llada):
    engine = llada.engine(EngineConfig(max_num_seqs=4))
    for round_ in range(3):
        reqs = [engine.add_request(p, GenerationParams(**kw).check()) for p, kw in zip(PROMPTS, SETTINGS)]
        _run(engine)
        for r in reqs:
            engine.release(r.id)
    assert not engine.requests and engine.num_running == 0 and engine.rows.k is None
    assert engine.rows.x.shape[0] == 0 and torch.equal(engine.rows.L, engine.rows.L[:0])


def test_static_scheduling_drains_before_admitting(llada):
    """The load benchmark's baseline: a new request waits until the running batch has drained."""
    engine = llada.engine(EngineConfig(max_num_seqs=2, scheduling="static", static_wait=0.0))
    kw = GenerationParams(**SETTINGS[1]).check()
    a = engine.add_request(PROMPTS[0], kw)
    engine.step()
    b = engine.add_request(PROMPTS[1], kw)
    while a.status != Status.FINISHED:
        engine.step()
        assert b.status == Status.WAITING or a.status == Status.FINISHED
    _run(engine)
    assert b.canvas == _alone(llada, PROMPTS[1], SETTINGS[1])


def test_ar_twin_row_alone_equals_row_in_batch(embedded_ar):
    """The AR twin is batch-invariant too."""
    ar = embedded_ar
    prompts = ["copy : red 4 owl", "json : name bob age 3 4 city rome", "sort : 7 4 0 9", "pick hand red cat sun :"]
    batch = ar.generate(prompts).results
    for p, r in zip(prompts, batch):
        assert ar.generate([p]).results[0].raw_ids == r.raw_ids


def test_engine_serves_the_ar_twin_with_the_tokens_of_its_own_loop(embedded_ar):
    """The AR twin in the engine (blocks of one token, one prefill, then one cached column per
    token) writes exactly what a plain KV-cached next-token loop writes (tests/reference.py's
    decode_ar, the twin's former offline loop), with the same forwards, alone and beside
    requests of other lengths."""
    from reference import decode_ar

    ar = embedded_ar
    prompts = ["copy : red 4 owl", "json : name bob age 3 4 city rome", "sort : 7 4 0 9", "pick hand red cat sun :"]
    ids = ar.encode(prompts, chat=False)
    lengths = [24, 16, 24, 8]
    engine = ar.engine()
    reqs = [engine.add_request(i, ar.default_params(gen_length=g)) for i, g in zip(ids, lengths)]
    _run(engine)
    for i, g, req in zip(ids, lengths, reqs):
        ref = decode_ar(ar.model, ar.token_ids, [i], g)
        assert req.canvas == ref.rows[0] and req.nfe == ref.row_nfe[0]
    assert sum(f.kind == "full" for f in engine.trace) == 1  # one prefill for the batch, then cached steps
