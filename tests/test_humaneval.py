"""The HumanEval execution sandbox against canonical and broken solutions, and a tiny model end
to end (its pass@1 is zero; the harness must still run and score)."""

import pytest

from unmask import GenerationParams
from unmask.bench import humaneval


@pytest.fixture(scope="module")
def probs():
    return humaneval.problems()


def test_all_164_problems(probs):
    assert len(probs) == 164 and probs[0]["task_id"] == "HumanEval/0"


@pytest.mark.parametrize("i", [0, 1, 2, 53, 163])
def test_canonical_solution_passes(probs, i):
    assert humaneval.check(probs[i], probs[i]["canonical_solution"])["passed"]


def test_broken_and_hanging_solutions_fail(probs):
    p = probs[0]
    assert not humaneval.check(p, "    return None\n")["passed"]
    assert "failed" in humaneval.check(p, "    raise ValueError('x')\n")["result"]
    hang = humaneval.check(p, "    while True:\n        pass\n", timeout=1.0)
    assert not hang["passed"] and hang["result"] == "timed out"


def test_truncation_at_stop_sequences():
    assert humaneval.truncate("    return 1\ndef other():\n    pass") == "    return 1"
    assert humaneval.truncate("    x = 1\n    return x\n") == "    x = 1\n    return x\n"


def test_tiny_model_end_to_end(llada):
    res = humaneval.run(llada, GenerationParams(gen_length=16, block_length=16), n=2, timeout=1.0)
    assert res.n == 2 and res.pass_at_1 == 0.0
    assert all(r["task_id"].startswith("HumanEval/") for r in res.results)


def test_cli_runner(capsys, llada_dir):
    import json

    from unmask.cli import main

    assert main(["humaneval", "--model", str(llada_dir), "--n", "2", "--gen-length", "8", "--block-length", "8",
                 "--timeout", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n"] == 2 and out["pass_at_1"] == 0.0 and out["nfe"] > 0
    assert main(["humaneval", "--model", str(llada_dir), "--timeout", "0"]) == 2
    assert "--timeout 0" in capsys.readouterr().err
