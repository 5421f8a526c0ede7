"""min_tokens (vLLM's and Mistral's): no end-of-text token is proposed before the answer (or a
hole) has that many tokens — on masked, block and autoregressive rows, cached or not, in a batch
with rows that have none; refused by name where it cannot apply."""

import pytest

from unmask import LLM, GenerationParams
from unmask.constrain import Constraint
from unmask.errors import UnmaskError

PROMPTS = ["copy : red sun", "reverse : black red wind", "sort : 7 4 0"]


@pytest.fixture(scope="module")
def llms():
    return {name: LLM(name) for name in ("default", "default-ar", "default-block")}


def _first_stop(llm, ids):
    stops = set(llm.token_ids.stop)
    return next((i for i, t in enumerate(ids) if t in stops), len(ids))


@pytest.mark.parametrize("name,cache", [("default", "none"), ("default", "dual"), ("default-ar", None),
                                        ("default-block", "exact")])
def test_no_end_of_text_before_min_tokens(llms, name, cache):
    llm = llms[name]
    extra = {} if cache is None else {"cache": cache}
    base = llm.generate(PROMPTS, llm.default_params(gen_length=16, **extra), chat=False)
    ends = [_first_stop(llm, r.raw_ids) for r in base.results]
    assert min(ends) < 10  # the answers end early without it
    got = llm.generate(PROMPTS, llm.default_params(gen_length=16, min_tokens=10, **extra), chat=False)
    for r in got.results:
        assert _first_stop(llm, r.raw_ids) >= 10
    # in a batch with rows that set none: theirs are the answers they give alone
    mixed = llm.engine()
    for i, p in enumerate(PROMPTS):
        ids = llm.encode([p], chat=False)[0]
        mixed.add_request(ids, llm.default_params(gen_length=16, min_tokens=10 if i == 0 else 0, **extra),
                          request_id=f"r{i}")
    out = _drain(mixed)
    assert _first_stop(llm, out["r0"]) >= 10
    assert out["r1"] == base.results[1].raw_ids[: len(out["r1"])]


def _drain(engine) -> dict[str, list[int]]:
    """Each request's committed ids, as the steps report them."""
    ids: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for o in engine.step():
            ids.setdefault(o.request.id, []).extend(o.new_ids)
    return ids


def test_a_hole_takes_min_tokens(llms):
    llm = llms["default"]
    p = llm.default_params(gen_length=8, min_tokens=5)
    r = llm.generate(["copy : red blue"], p, suffix=" green", chat=False).results[0]
    assert _first_stop(llm, r.raw_ids) >= 5


@pytest.mark.parametrize("params,match", [
    (dict(gen_length=8, block_length=8, min_tokens=9), "min_tokens 9 exceeds gen_length 8"),
    (dict(gen_length=8, min_tokens=-1), "min_tokens -1 must be a non-negative integer"),
    (dict(gen_length=8, min_tokens=2, compat="llada", block_length=8, steps=8), "min_tokens 2"),
])
def test_bad_min_tokens_are_refused_by_name(llms, params, match):
    with pytest.raises(UnmaskError, match=match):
        llms["default"].generate(["copy : red"], GenerationParams(**params), chat=False)


def test_min_tokens_with_structured_output_is_refused(llms):
    with pytest.raises(UnmaskError, match="min_tokens 3 with structured output"):
        llms["default"].generate(["copy : red"], llms["default"].default_params(gen_length=8, min_tokens=3),
                                 chat=False, constraint=Constraint.of("regex", "red"))
