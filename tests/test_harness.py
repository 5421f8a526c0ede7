"""The lm-evaluation-harness adapter: registered as `unmask`, runs lm-eval's own pipeline over
the packaged GSM8K copy, scores like our GSM8K scorer, and computes likelihoods."""

import json
import math

import pytest
import torch

pytest.importorskip("lm_eval")

from lm_eval import simple_evaluate  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from unmask import LLM  # noqa: E402
from unmask.bench import gsm8k  # noqa: E402
from unmask.bench import harness  # noqa: E402
from unmask.errors import UnmaskError  # noqa: E402


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    return TaskManager(include_path=str(harness.write_task_dir(tmp_path_factory.mktemp("tasks"))))


def _scores(results) -> dict:
    r = results["results"]["gsm8k_unmask"]
    return {"strict": r["exact_match,strict-match"], "flexible": r["exact_match,flexible-extract"]}


def test_registered_under_its_name():
    assert get_model("unmask") is harness.UnmaskLM


@pytest.mark.slow
def test_tiny_model_through_lm_eval(llada_dir, tasks):
    lm = harness.UnmaskLM(model=str(llada_dir), gen_length=8, block_length=8, batch_size=2)
    res = simple_evaluate(model=lm, tasks=["gsm8k_unmask"], task_manager=tasks, limit=3, num_fewshot=5)
    assert set(_scores(res)) == {"strict", "flexible"}  # plumbing only: the weights are random


COPY_YAML = """task: copy_unmask
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    test: {test}
output_type: generate_until
test_split: test
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


@pytest.mark.slow
def test_embedded_model_solves_copy_through_lm_eval(tmp_path):
    """lm-eval's own pipeline (task YAML, generate_until, its exact_match) over the adapter and the
    embedded model: the held-out copy task, which the model solves 99 % of the time, must score
    high. A broken decoder, adapter or prompt encoding fails this."""
    from unmask.tasks import held_out

    data = tmp_path / "copy.jsonl"
    data.write_text("".join(json.dumps({"prompt": ex.prompt, "answer": ex.answer}) + "\n"
                            for ex in held_out("copy", 16)))
    (tmp_path / "copy_unmask.yaml").write_text(COPY_YAML.format(test=data))
    lm = harness.UnmaskLM(model="default", batch_size=8)
    res = simple_evaluate(model=lm, tasks=["copy_unmask"], task_manager=TaskManager(include_path=str(tmp_path)))
    assert res["results"]["copy_unmask"]["exact_match,none"] >= 14 / 16


@pytest.mark.parametrize("answer,expect", [("gold", 1.0), ("last", 1.0), ("wrong", 0.0)])
def test_lm_eval_scores_like_our_scorer(llada_dir, tasks, monkeypatch, answer, expect):
    """Our YAML reproduces lm-eval's gsm8k filters: a gold worked answer scores under both
    extractions, a bare last number only under the flexible one, a wrong one under neither."""
    test = gsm8k.load("test")
    by_question = {p.question: p for p in test[:4]}

    def fake(self, requests, disable_tqdm=False):
        out = []
        for r in requests:
            q = r.args[0].rsplit("Question: ", 1)[1].rsplit("\nAnswer:", 1)[0]
            p = by_question[q]
            text = {"gold": " " + p.answer, "last": f" so it is {gsm8k.gold(p)}.",
                    "wrong": " #### 123456789"}[answer]
            assert gsm8k.score(text, p)["flexible"] == (expect == 1.0)
            out.append(text)
        return out

    monkeypatch.setattr(harness.UnmaskLM, "generate_until", fake)
    lm = harness.UnmaskLM(model=str(llada_dir), gen_length=8, block_length=8)
    scores = _scores(simple_evaluate(model=lm, tasks=["gsm8k_unmask"], task_manager=tasks, limit=4))
    assert scores["flexible"] == expect
    assert scores["strict"] == (expect if answer == "gold" else 0.0)


@pytest.mark.slow
def test_cli_entry_writes_results(llada_dir, tmp_path):
    from unmask.cli import main

    out = tmp_path / "res"
    rc = main(["lm-eval", "--model", "unmask", "--model_args", f"model={llada_dir},gen_length=8,block_length=8",
               "--tasks", "gsm8k_unmask", "--limit", "2", "--output_path", str(out)])
    assert rc == 0
    files = list(out.rglob("results*.json"))
    assert files and "gsm8k_unmask" in json.loads(files[0].read_text())["results"]


def test_bad_model_args_are_named(llada_dir):
    with pytest.raises(UnmaskError, match="colour"):
        harness.UnmaskLM(model=str(llada_dir), colour="red")
    with pytest.raises(UnmaskError, match="gen_length"):
        harness.UnmaskLM(model=str(llada_dir), gen_length="many")
    with pytest.raises(UnmaskError, match="policy"):
        harness.UnmaskLM(model=str(llada_dir), policy="greedy-ish")


def test_ar_likelihood_is_exact_and_pairs_are_even(embedded_ar):
    """The AR twin: log p of a valid pairs answer is about log 1/2 for each of the two phrases,
    a mixed phrase is far less likely, and greedy agrees with the likelier phrase."""
    ar = embedded_ar
    prompt = ar.tokenizer.encode("pick hand red cat sun :")
    lp = {a: harness.likelihood(ar, prompt, ar.tokenizer.encode(a + " <|endoftext|>", add_special_tokens=False))
          for a in ("full house", "high card", "high house")}
    assert math.exp(lp["full house"][0]) + math.exp(lp["high card"][0]) > 0.9
    assert lp["high house"][0] < min(lp["full house"][0], lp["high card"][0]) - 5
    assert lp["full house"][1] != lp["high card"][1]  # exactly one of them is the greedy answer


def test_diffusion_bound_with_one_token_is_the_exact_conditional(embedded):
    """For a one-token continuation the Monte-Carlo bound has one term: log p(token | prompt, MASK)."""
    llm = embedded
    prompt = llm.tokenizer.encode("copy : 3 dog 7")
    target = llm.tokenizer.encode("3", add_special_tokens=False)
    value, greedy = harness.likelihood(llm, prompt, target, mc_num=4)
    ids = torch.tensor([prompt + [llm.token_ids.mask]])
    shift = llm.arch.logit_shift
    with torch.no_grad():
        logits = llm.model(ids, torch.arange(ids.shape[1])[None])[0, len(prompt) - shift]
    assert value == pytest.approx(float(torch.log_softmax(logits.float(), -1)[target[0]]), abs=1e-4)
    assert greedy is False


def test_diffusion_bound_prefers_valid_pairs(embedded):
    llm = embedded
    prompt = llm.tokenizer.encode("pick hand red cat sun :")
    enc = lambda a: llm.tokenizer.encode(a + " <|endoftext|>", add_special_tokens=False)  # noqa: E731
    valid = harness.likelihood(llm, prompt, enc("full house"))[0]
    mixed = harness.likelihood(llm, prompt, enc("high house"))[0]
    assert valid > mixed + 3


@pytest.mark.slow
def test_lm_eval_local_completions_against_the_server_equals_unmask_eval(tmp_path):
    """An outside client: lm-eval's own `local-completions` model (its HTTP client, request
    shapes and retries) against a running `unmask serve`, on six of the embedded tasks (each with
    one right answer: copy, reverse, sort, arith, json, word; pairs accepts several, which
    lm-eval's exact_match against one target does not; 12 examples each, the first of the
    selection split, as `unmask eval` takes them),
    gives, sample for sample, the answers `unmask eval` gives and the same exact-match accuracy,
    and what the in-process adapter gives (greedy; max_gen_toks = the embedded model's canvas of
    24: the server's max_tokens is the canvas length). `unmask eval` and the adapter run the
    reference setting (one token per step, no cache); the task's generation_kwargs carry it to
    the server as extra fields (lm-eval sends them in the request body)."""
    pytest.importorskip("tenacity")  # lm-eval's [api] extra
    import lm_eval.models  # noqa: F401  (registers lm-eval's own models, local-completions among them)
    from test_server import Server

    from unmask.evaluate import examples_of, run_task

    tasks, n = ("copy", "reverse", "sort", "arith", "json", "word"), 12
    for task in tasks:
        data = tmp_path / f"{task}.jsonl"
        data.write_text("".join(json.dumps({"prompt": ex.prompt, "answer": ex.answer}) + "\n"
                                for ex in examples_of(task, n)))
        (tmp_path / f"{task}_unmask.yaml").write_text(
            COPY_YAML.format(test=data).replace("copy_unmask", f"{task}_unmask")
            .replace("  do_sample: false", "  do_sample: false\n  max_gen_toks: 24\n  policy: fixed\n"
                                              "  cache: none\n  steps: 24\n  block_length: 24"))
    names = [f"{t}_unmask" for t in tasks]
    manager = TaskManager(include_path=str(tmp_path))
    local = harness.UnmaskLM(model="default", batch_size=8)
    mine = simple_evaluate(model=local, tasks=names, task_manager=manager, log_samples=True)
    s = Server(local.llm, served_model_name="default")
    try:
        theirs = simple_evaluate(model="local-completions", task_manager=manager, tasks=names,
                                 model_args=f"model=default,base_url={s.url}/v1/completions,tokenizer_backend=None,"
                                            "tokenized_requests=False,num_concurrent=2,max_retries=1",
                                 log_samples=True)
    finally:
        s.stop()
    for task, name in zip(tasks, names):
        resps = lambda res: [smp["resps"][0][0] for smp in sorted(res["samples"][name], key=lambda x: x["doc_id"])]  # noqa: E731
        ours = run_task(local.llm, task, n, local.llm.params_for({}, fast=False), 8, keep_samples=n)  # unmask eval's
        assert resps(theirs) == resps(mine) == [x["output"] for x in ours.samples], task
        accuracy = theirs["results"][name]["exact_match,none"]
        assert accuracy == mine["results"][name]["exact_match,none"] == sum(ours.flags) / n, task
    assert theirs["results"]["copy_unmask"]["exact_match,none"] >= 0.75  # the model does solve copy
