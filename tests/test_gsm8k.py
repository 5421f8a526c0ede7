"""GSM8K answer extraction against the real gold answers, and the prompt format."""

import pytest

from unmask.bench import gsm8k


@pytest.fixture(scope="module")
def test_split():
    return gsm8k.load("test")


def test_packaged_copy_is_complete(test_split):
    assert len(test_split) == 1319
    assert test_split[0].question.startswith("Janet")


def test_gold_solutions_score_under_both_extractions(test_split):
    """A model that writes the gold worked solution gets full marks, strict and flexible."""
    for p in test_split:
        s = gsm8k.score(" " + p.answer + "\n\nQuestion: next one", p)
        assert s["strict"] and s["flexible"], p.answer[-40:]


def test_extraction_rules():
    p = gsm8k.Problem("q", "work\n#### 1,234")
    assert gsm8k.gold(p) == "1234"
    assert gsm8k.score("so it is $1,234.", p) == {"strict": False, "flexible": True}
    assert gsm8k.score("#### 1234\nthen 7", p) == {"strict": True, "flexible": False}
    assert gsm8k.score("no number here", p) == {"strict": False, "flexible": False}
    assert gsm8k.flexible_extract("a 12 b -3.5 c") == "-3.5"
    assert gsm8k.strict_extract("#### -7") == "-7"


def test_wrong_answers_are_wrong(test_split):
    for p in test_split[:50]:
        wrong = str(int(gsm8k.gold(p)) + 1) if gsm8k.gold(p).lstrip("-").isdigit() else "0"
        assert not any(gsm8k.score(f"#### {wrong}", p).values())


def test_five_shot_prompt_format():
    shots = gsm8k.load("train")[:5]
    prompt = gsm8k.build_prompt("How many?", shots)
    assert prompt.startswith("Question: Natalia sold clips")
    assert prompt.endswith("\n\nQuestion: How many?\nAnswer:")
    assert prompt.count("Question:") == 6 and prompt.count("#### ") == 5


def test_cli_runner_scores_a_tiny_model(capsys, llada_dir):
    import json

    from unmask.cli import main

    assert main(["gsm8k", "--model", str(llada_dir), "--n", "3", "--shots", "2", "--gen-length", "8",
                 "--block-length", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n"] == 3 and out["strict"] == 0.0 and len(out["samples"]) == 3
    assert out["strict_ci"][0] == 0.0 and 0 < out["strict_ci"][1] < 1
    assert out["nfe"] > 0 and out["params"]["gen_length"] == 8
    assert {"question", "gold", "completion", "strict", "flexible"} <= set(out["samples"][0])
    assert main(["gsm8k", "--model", str(llada_dir), "--shots", "9"]) == 2
    assert "shots 9" in capsys.readouterr().err
    assert main(["gsm8k", "--model", str(llada_dir), "--n", "0"]) == 2
