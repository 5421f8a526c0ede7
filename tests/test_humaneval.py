"""The HumanEval execution sandbox against canonical and broken solutions, and a tiny model end
to end, its completions checked against the reference sampler's."""

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


def test_end_to_end_completions_are_the_reference_samplers(llada, llada_dir, probs):
    """The harness scores exactly what LLaDA's own sampler writes for each prompt: completions are
    checked against the reference port (tests/reference.py) run on the same tiny checkpoint, and
    each pass/fail against the sandbox on that completion. A broken decoder fails this."""
    import torch

    from reference import RefModel, llada_generate

    params = GenerationParams(gen_length=16, block_length=8, steps=8, compat="llada")
    res = humaneval.run(llada, params, n=2, timeout=1.0, batch_size=1)
    assert res.n == 2 and [r["task_id"] for r in res.results] == ["HumanEval/0", "HumanEval/1"]
    ref = RefModel(llada_dir)
    stops = set(llada.token_ids.stop)
    for p, r in zip(probs[:2], res.results):
        ids = torch.tensor([llada.encode(p["prompt"], chat=False, unknown_words="ignore")[0]])
        gen = llada_generate(ref, ids, 8, 16, 8, mask_id=llada.token_ids.mask)[0, ids.shape[1]:].tolist()
        cut = next((j for j, t in enumerate(gen) if t in stops), len(gen))
        expected = humaneval.truncate(llada.tokenizer.decode(gen[:cut]))
        assert r["completion"] == expected
        assert r["passed"] == humaneval.check(p, expected, 1.0)["passed"]
    assert res.pass_at_1 == sum(r["passed"] for r in res.results) / 2


def test_cli_runner(capsys, llada_dir):
    import json

    from unmask.cli import main

    assert main(["humaneval", "--model", str(llada_dir), "--n", "2", "--gen-length", "8", "--block-length", "8",
                 "--timeout", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n"] == 2 and 0.0 <= out["pass_at_1"] <= 1.0 and out["nfe"] > 0 and len(out["results"]) == 2
    assert main(["humaneval", "--model", str(llada_dir), "--timeout", "0"]) == 2
    assert "--timeout 0" in capsys.readouterr().err
