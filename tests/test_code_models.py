"""The shipped code models (default-code and its autoregressive twin): they load through the
normal loader by name, carry their corpus manifest, infill (natively / prefix-suffix-middle)
and reproduce, output for output, the held-out single-line holes recorded when they were
shipped (scripts/ship_default.py --code)."""

import json

import pytest

from unmask import LLM
from unmask.loading import EMBEDDED
from unmask.train.code import hole_examples, hole_matches

FIRST = 8


@pytest.mark.parametrize("name", ["default-code", "default-code-ar"])
def test_the_code_models_load_with_their_recipe(name):
    llm = LLM(name)
    meta = json.loads((EMBEDDED[name] / "training.json").read_text())
    assert meta["corpus"]["version"] == "3.11.7" and meta["config"]["corpus"] == "stdlib"
    assert llm.arch.causal == (name == "default-code-ar") and llm.token_ids.fim is not None
    assert llm.tokenizer.vocab_size == 4096
    assert next(llm.model.parameters()).dtype.is_floating_point
    # a hole given only a bound: decoded at several lengths (trained on exact-length spans, docs/infilling.md)
    assert llm.default_params().hole_length == (None if llm.arch.causal else "consensus")  # None: "bound"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["default-code", "default-code-ar"])
def test_the_code_models_reproduce_their_recorded_holes(name):
    llm = LLM(name)
    recorded = json.loads((EMBEDDED[name] / "eval.json").read_text())
    exs = hole_examples(llm.tokenizer, "test", "single", FIRST)
    got = [hole_matches(llm, e) for e in exs]
    assert got == recorded["flags"][:FIRST]
