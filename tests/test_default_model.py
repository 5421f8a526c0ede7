"""The embedded default model and its AR twin: they load through the normal loader, with no
--model, and reproduce the held-out accuracy recorded when they were shipped."""

import json

import pytest

from unmask import LLM, GenerationParams
from unmask.cli import main
from unmask.evaluate import evaluate
from unmask.llm import EMBEDDED

SAMPLE = 100


@pytest.mark.parametrize("name", ["default", "default-ar"])
def test_embedded_model_reproduces_its_recorded_accuracy(name):
    llm = LLM(None if name == "default" else name)
    assert llm.path == EMBEDDED[name]
    assert json.loads((llm.path / "config.json").read_text())["model_type"] == "llada"
    recorded = json.loads((llm.path / "eval.json").read_text())
    g = llm.generation_defaults["gen_length"]
    results = evaluate(llm, n=SAMPLE, params=GenerationParams(gen_length=g, block_length=g, steps=g), batch_size=SAMPLE)
    # greedy decoding is deterministic: the first SAMPLE held-out examples score as recorded
    # (a margin of two examples for float differences between machines)
    for r, rec in zip(results, recorded["results"]):
        assert r.task == rec["task"]
        assert abs(r.exact - rec["exact_first_100"]) <= 0.02, (r.task, r.exact, rec["exact_first_100"])


def test_generate_without_model_flag(capsys):
    assert main(["generate", "pick hand red cat sun :", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["nfe"] >= 1 and len(obj["generated_ids"]) == 1
