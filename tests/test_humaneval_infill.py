"""HumanEval-infilling: the vendored data, the sandbox on canonical and broken middles, and the
harness end to end on a tiny model (its middles equal LLM.generate's with the suffix)."""

import json

import pytest

from unmask import GenerationParams
from unmask.bench import humaneval_infill as hi
from unmask.cli import main
from unmask.errors import UnmaskError


@pytest.mark.parametrize("name,count", [("single-line", 1033), ("multi-line", 5815), ("random-span", 1640),
                                             ("random-span-light", 164)])
def test_vendored_benchmarks(name, count):
    probs = hi.problems(name)
    assert len(probs) == count
    assert {"task_id", "prompt", "suffix", "canonical_solution", "test", "entry_point"} <= set(probs[0])


@pytest.mark.parametrize("name,i", [("single-line", 0), ("single-line", 500), ("multi-line", 7),
                                         ("random-span", 3)])
def test_canonical_middles_pass_and_broken_ones_fail(name, i):
    p = hi.problems(name)[i]
    assert hi.check(p, p["canonical_solution"])["passed"], p["task_id"]
    assert not hi.check(p, p["canonical_solution"] + "    raise ValueError('x')\n")["passed"]


def test_single_line_middles_keep_one_line():
    assert hi.truncate("    x = 1\n    y = 2\n", "single-line") == "    x = 1\n"
    assert hi.truncate("    x = 1\n    y = 2\n", "multi-line") == "    x = 1\n    y = 2\n"
    with pytest.raises(UnmaskError, match="unknown benchmark 'two-line'"):
        hi.problems("two-line")


def test_the_harness_end_to_end_on_a_tiny_model(llada, capsys, llada_dir):
    p = GenerationParams(gen_length=8, block_length=8, steps=8)
    res = hi.run(llada, p, "single-line", n=3, batch_size=2)
    probs = hi.problems("single-line")[:3]
    want = llada.generate([q["prompt"] for q in probs], p, chat=False, unknown_words="ignore",
                          suffix=[q["suffix"] for q in probs])
    assert [r["middle"] for r in res.results] == [hi.truncate(r.text, "single-line") for r in want.results]
    assert res.n == 3 and res.nfe > 0 and 0 <= res.pass_at_1 <= res.n
    code = main(["humaneval-infill", "--model", str(llada_dir), "--benchmark", "multi-line", "--n", "2",
                 "--gen-length", "8", "--block-length", "8", "--steps", "8", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["benchmark"] == "multi-line" and len(out["results"]) == 2
