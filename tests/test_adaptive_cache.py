"""The adaptive cache (issue 13, part 3): DualCache's windows, and a row refreshes once it has
committed `refresh_tokens` tokens since its last full forward."""

import pytest

from unmask import GenerationParams, UnmaskError
from unmask.engine.diagnostics import Observer

PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6, 5], [2, 7, 1], [8, 2, 8, 1, 8, 2]]
POLICIES = [dict(policy="fixed"), dict(policy="fixed", steps=8), dict(policy="threshold", threshold=0.3),
            dict(policy="factor", factor=2.0), dict(policy="entropy", gamma=0.5), dict(policy="budget", budget=2.0),
            dict(policy="fixed", remasking="random", seed=5)]


@pytest.mark.parametrize("fixture", ["llada", "dream"])
@pytest.mark.parametrize("kw", POLICIES)
@pytest.mark.parametrize("scope, equals", [("canvas", "none"), ("suffix", "prefix")])
def test_trigger_every_step_equals_the_uncached_decode(request, fixture, kw, scope, equals):
    """Every step commits at least one token, so refresh_tokens=1 triggers a refresh before every
    cached step: with scope canvas the decode is exactly no cache's (tokens and forwards), with
    scope suffix exactly PrefixCache's, for every commit policy, in a batch."""
    llm = request.getfixturevalue(fixture)
    base = dict(gen_length=16, block_length=8, **kw)
    ref = llm.generate(PROMPTS, GenerationParams(cache=equals, **base))
    out = llm.generate(PROMPTS, GenerationParams(cache="adaptive", refresh_tokens=1, refresh_scope=scope, **base))
    assert [r.raw_ids for r in out.results] == [r.raw_ids for r in ref.results]
    assert [r.nfe for r in out.results] == [r.nfe for r in ref.results]
    shape = lambda steps: [(s.refresh, s.rows, s.positions) for s in steps]  # noqa: E731
    assert shape(out.steps) == shape(ref.steps)


@pytest.mark.parametrize("fixture", ["llada", "dream"])
@pytest.mark.parametrize("kw", POLICIES[:4])
@pytest.mark.parametrize("scope, equals", [("canvas", "none"), ("suffix", "prefix")])
def test_doubting_every_cached_step_recomputes_it(request, fixture, kw, scope, equals):
    """refresh_below=1 doubts every cached step (no token has probability 1 here): each is
    recomputed before anything commits, so the tokens are those of no cache (scope canvas) or
    of PrefixCache (scope suffix), and each doubted step counts two forwards."""
    llm = request.getfixturevalue(fixture)
    base = dict(gen_length=16, block_length=8, early_stop=False, **kw)
    ref = llm.generate(PROMPTS, GenerationParams(cache=equals, **base))
    out = llm.generate(PROMPTS, GenerationParams(cache="adaptive", refresh_below=1.0, refresh_scope=scope, **base))
    assert [r.raw_ids for r in out.results] == [r.raw_ids for r in ref.results]
    for got, want in zip(out.results, ref.results):
        redone = got.nfe - want.nfe  # the wasted windows
        assert redone == want.nfe - 2  # every step but the two block starts was cached, and doubted
        assert redone == sum(1 for n in got.commits if n == 0)
        assert [n for n in got.commits if n] == want.commits


@pytest.mark.parametrize("fixture", ["llada", "dream"])
@pytest.mark.parametrize("triggers", [dict(refresh_tokens=9), dict(refresh_below=1e-9),
                                      dict(refresh_tokens=9, refresh_below=1e-9, refresh_scope="canvas")])
def test_triggers_that_never_fire_equal_dual_cache(request, fixture, triggers):
    """A token trigger larger than a block, or a probability no commit falls below, never fires:
    the decode is DualCache's, forward for forward."""
    llm = request.getfixturevalue(fixture)
    base = dict(gen_length=16, block_length=8, policy="threshold", threshold=0.3)
    dual = llm.generate(PROMPTS, GenerationParams(cache="dual", **base))
    out = llm.generate(PROMPTS, GenerationParams(cache="adaptive", **triggers, **base))
    assert [r.raw_ids for r in out.results] == [r.raw_ids for r in dual.results]
    assert [(s.refresh, s.positions) for s in out.steps] == [(s.refresh, s.positions) for s in dual.steps]


@pytest.mark.parametrize("per_step, tokens, expect", [
    (1, 3, [True, False, False, True, False, False, True, False]),  # refresh after every 3 commits
    (2, 3, [True, False, True, False]),  # 2, then 4 >= 3: refresh; counts restart there
    (2, 4, [True, False, True, False]),
    (1, 8, [True] + [False] * 7),  # never within a block of 8: DualCache
])
@pytest.mark.parametrize("scope", ["canvas", "suffix"])
def test_refresh_fires_on_tokens_committed_since_the_last_refresh(llada, per_step, tokens, expect, scope):
    shift = llada.arch.logit_shift
    p = GenerationParams(gen_length=16, block_length=8, steps=16 // per_step, cache="adaptive",
                         refresh_tokens=tokens, refresh_scope=scope, early_stop=False)
    out = llada.generate([[1, 2, 3]], p)
    assert len(out.steps) == 2 * len(expect)
    for b, s in enumerate(out.steps):
        first, fired = b % len(expect) == 0, expect[b % len(expect)]  # the same pattern in both blocks
        block_start = 3 + 8 * (b // len(expect))
        suffix = 3 + 16 - block_start + shift  # block and masked suffix (PrefixCache's window; the last block: none)
        assert s.refresh == (first or (fired and scope == "canvas"))
        assert s.positions == (3 + 16 if s.refresh else suffix if fired else 8 + shift)


def test_rows_refresh_on_their_own(llada):
    """Rows that commit at different rates refresh at different steps of the same batch (one step
    runs a full forward for some rows and a cached window for the others), and each row's tokens
    equal the request decoded alone."""
    settings = [dict(steps=16), dict(steps=8), dict(policy="threshold", threshold=0.3)]
    engine = llada.engine()
    reqs = []
    for prompt, kw in zip(PROMPTS, settings):
        p = GenerationParams(gen_length=16, block_length=8, cache="adaptive", refresh_tokens=3, early_stop=False, **kw)
        reqs.append((engine.add_request(prompt, p.check()), prompt, p))
    while engine.has_unfinished():
        engine.step()
    full = [(t.kind, t.rows) for t in engine.trace]
    assert any(kind == "full" and rows < len(PROMPTS) for kind, rows in full)  # some rows refreshed, others not
    for req, prompt, p in reqs:
        assert req.canvas == llada.generate([prompt], p).results[0].raw_ids


def test_adaptive_recovers_agreement_that_dual_loses(llada):
    """Observed against fresh forwards: the adaptive cache never commits at a cache older than
    its trigger allows, so its commits see at most refresh_tokens - 1 stale tokens."""
    obs = Observer()
    engine = llada.engine()
    engine.observer = obs
    p = GenerationParams(gen_length=16, block_length=8, policy="fixed", steps=8, cache="adaptive", refresh_tokens=3,
                         refresh_scope="canvas", early_stop=False).check()
    for prompt in PROMPTS:
        engine.add_request(prompt, p)
    while engine.has_unfinished():
        engine.step()
    assert obs.commits and max(c.since_refresh for c in obs.commits) == 2
    assert all(c.agree for c in obs.commits if c.since_refresh == 0)


@pytest.mark.parametrize("kw, message", [
    (dict(cache="dual", refresh_tokens=2), "refresh_tokens 2 is a setting of cache adaptive, not of cache dual"),
    (dict(cache="adaptive", refresh_tokens=0), "refresh_tokens 0 must be a positive integer"),
    (dict(cache="adaptive", compat="llada"), "compat 'llada' does not support cache 'adaptive'"),
])
def test_bad_settings_are_named(kw, message):
    with pytest.raises(UnmaskError, match=message):
        GenerationParams(gen_length=16, block_length=8, **kw).check()


def test_block_models_refuse_the_adaptive_cache(tmp_path):
    from tests.checkpoints import write_sdar
    from unmask import LLM

    llm = LLM(write_sdar(tmp_path / "sdar"))
    with pytest.raises(UnmaskError, match="cache 'adaptive' approximates"):
        llm.generate([[1, 2, 3]], GenerationParams(gen_length=8, block_length=4, cache="adaptive"))


def test_defaults_and_implied_cache():
    """No trigger given: refresh below 0.9, scope suffix. A trigger alone names the cache."""
    from unmask.cache import make_cache_policy
    from unmask.params import resolve_params

    cache = make_cache_policy(GenerationParams(gen_length=16, block_length=8, cache="adaptive").check())
    assert (cache.refresh_below, cache.refresh_tokens, cache.refresh_scope) == (0.9, None, "suffix")
    assert resolve_params({"refresh_tokens": 3}).cache == "adaptive"
    with pytest.raises(UnmaskError, match="refresh_below 0.5 is a setting of cache adaptive"):
        resolve_params({"refresh_below": 0.5, "cache": "prefix"})
