"""`--compat dllm-mdlm` / `dllm-bd3lm` on dllm's A2D checkpoints against what dllm's own code
returned.

tests/data/a2d-upstream/ holds three small random A2D checkpoints (qwen3, qwen2, llama) written by
dllm's own model classes, `cases.json` (shared/data/a2d-upstream: 24 batches through dllm's
unmodified MDLMSampler and BD3LMSampler, eager attention) and `extra-cases.json` (60 more, recorded
the same way for this project outside it: transformers' default sdpa attention on every
checkpoint, and a checkpoint whose answers end mid-canvas, so BD3LM's early stop and its treatment
of a written end-of-text as padding are exercised; README.md there). Every row must match: the
tokens the sampler returned after its prompt and the forwards it ran. Nothing here was written by
this project except the comparison.
"""

import json
from pathlib import Path

import pytest

from unmask import LLM, GenerationParams
from unmask.errors import UnmaskError

DATA = Path(__file__).parent / "data" / "a2d-upstream"
CASES = ([{**c, "attn_implementation": "eager"} for c in json.loads((DATA / "cases.json").read_text())]
         + json.loads((DATA / "extra-cases.json").read_text()))


@pytest.fixture(scope="module")
def a2d():
    return {}


def _llm(a2d, name: str) -> LLM:
    if name not in a2d:
        a2d[name] = LLM(DATA / name)
    return a2d[name]


def _want(c: dict) -> list[list[int]]:
    """Each row's part of the sampler's returned tensor after its prompt: MDLM's rows are the prompt,
    the generated tokens, then end-of-text padding; BD3LM's the left-padded prompt block(s), then
    the blocks it decoded (fewer when it stopped early)."""
    lens = [len(p) for p in c["prompts"]]
    if c["sampler"] == "mdlm":
        for s, n in zip(c["sequences"], lens):
            assert set(s[n + c["max_new_tokens"]:]) <= {c["eos_id"]}  # the padding after a shorter row
        return [s[n : n + c["max_new_tokens"]] for s, n in zip(c["sequences"], lens)]
    start = -(-max(lens) // c["block_size"]) * c["block_size"]
    return [s[start:] for s in c["sequences"]]


def test_the_cases_cover_what_they_claim():
    assert len(CASES) == 84
    assert {c["attn_implementation"] for c in CASES if c["sampler"] == "bd3lm"} == {"sdpa", "eager"}
    stopped = [c for c in CASES if c["sampler"] == "bd3lm" and len(_want(c)[0]) < c["max_new_tokens"]]
    assert len(stopped) >= 3  # BD3LM decodes that ended before max_new_tokens (every row wrote end-of-text)
    assert any(c["max_new_tokens"] % c["block_size"] for c in CASES)  # a partial last block


@pytest.mark.parametrize("case", range(len(CASES)))
def test_compat_dllm_returns_what_dllm_returned(a2d, case):
    c = CASES[case]
    llm = _llm(a2d, c["checkpoint"])
    assert (llm.token_ids.mask, llm.token_ids.eos, llm.token_ids.pad) == (c["mask_id"], c["eos_id"], c["pad_id"])
    out = llm.generate(c["prompts"], GenerationParams(
        compat=f"dllm-{c['sampler']}", gen_length=c["max_new_tokens"], block_length=c["block_size"], steps=c["steps"],
        attn_implementation=c["attn_implementation"]))
    assert [r.raw_ids for r in out.results] == _want(c)
    assert out.nfe == c["forwards"]
    assert [r.nfe for r in out.results] == [c["forwards"]] * len(c["prompts"])


def test_the_eager_and_sdpa_readings_of_bd3lm_differ(a2d):
    """The same prompts under the two attention implementations: the recorded eager cases are not
    what dllm's default (sdpa) returns, so the setting matters and is not silently ignored."""
    c = next(c for c in CASES if c["sampler"] == "bd3lm" and c["attn_implementation"] == "eager")
    llm = _llm(a2d, c["checkpoint"])
    p = dict(compat="dllm-bd3lm", gen_length=c["max_new_tokens"], block_length=c["block_size"], steps=c["steps"])
    eager = llm.generate(c["prompts"], GenerationParams(**p, attn_implementation="eager"))
    sdpa = llm.generate(c["prompts"], GenerationParams(**p))  # the default
    assert [r.raw_ids for r in eager.results] == _want(c)
    assert [r.raw_ids for r in sdpa.results] != _want(c)


@pytest.mark.parametrize("bad, message", [
    (dict(top_k=5), "top_k / top_p"),
    (dict(policy="threshold"), "policy 'threshold'"),
    (dict(attn_implementation="flash"), "attn_implementation 'flash'"),
])
def test_the_dllm_modes_refuse_what_they_do_not_reproduce(a2d, bad, message):
    llm = _llm(a2d, "ckpt-qwen3")
    with pytest.raises(UnmaskError, match=message):
        llm.generate([[1, 2, 3]], dict(compat="dllm-mdlm", gen_length=8, block_length=4, **bad))


def test_the_dllm_modes_need_an_a2d_model():
    with pytest.raises(UnmaskError, match="dllm-mdlm.*a2d models"):
        LLM().generate(["copy : red"], dict(compat="dllm-mdlm", gen_length=8, block_length=8))


INFILL = json.loads((DATA / "infill-cases.json").read_text())


@pytest.mark.parametrize("case", range(len(INFILL)))
def test_compat_dllm_mdlm_infills_as_dllm_does(a2d, case):
    """MDLMSampler.infill on prompt + masks + suffix (infill-cases.json: rows of unequal lengths,
    blocks over the whole canvas, sdpa and eager): the hole's tokens and the forwards."""
    c = INFILL[case]
    out = _llm(a2d, c["checkpoint"]).generate(c["prompts"], GenerationParams(
        compat="dllm-mdlm", gen_length=c["holes"][0], block_length=c["block_size"], steps=c["steps"],
        attn_implementation=c["attn_implementation"]), suffix=c["suffixes"])
    want = [s[len(p) : len(p) + h] for s, p, h in zip(c["sequences"], c["prompts"], c["holes"])]
    assert [r.raw_ids for r in out.results] == want
    assert out.nfe == c["forwards"]
    for s, p, h, suf in zip(c["sequences"], c["prompts"], c["holes"], c["suffixes"]):
        assert s[len(p) + h : len(p) + h + len(suf)] == suf  # the suffix is kept


SAMPLED = json.loads((DATA / "sampled-cases.json").read_text())


@pytest.mark.parametrize("case", range(len(SAMPLED)))
def test_compat_dllm_samples_as_dllm_does(a2d, case):
    """Temperature > 0 (Gumbel noise in float64) and random remasking, seeded as
    `torch.manual_seed(seed)` before dllm's call (sampled-cases.json)."""
    c = SAMPLED[case]
    out = _llm(a2d, c["checkpoint"]).generate(c["prompts"], GenerationParams(
        compat=f"dllm-{c['sampler']}", gen_length=c["max_new_tokens"], block_length=c["block_size"], steps=c["steps"],
        temperature=c["temperature"], remasking=c["remasking"], seed=c["seed"]))
    assert [r.raw_ids for r in out.results] == _want(c)
    assert out.nfe == c["forwards"]
