"""`--compat open-dcoder` against what Open-dCoder's own sampler returned.

tests/data/open-dcoder-upstream/ holds two small random checkpoints in Open-dCoder's released
layout (Qwen2's config, recognised by the folder's name) written by its own model class, and 24
batches through its unmodified `diffusion_generate` (README.md there: every algorithm, infilling,
a seeded origin run, a config that sets pad_token_id with and without that id in a prompt). Every
row must match in tokens and forwards. Nothing here was written by this project but the
comparison.
"""

import json
from pathlib import Path

import pytest

from unmask import LLM, GenerationParams
from unmask.errors import UnmaskError

DATA = Path(__file__).parent / "data" / "open-dcoder-upstream"
CASES = json.loads((DATA / "cases.json").read_text())


@pytest.fixture(scope="module")
def models():
    return {name: LLM(DATA / name) for name in ("open-dcoder-plain", "open-dcoder-pad")}


def _run(llm, c):
    return llm.generate(c["prompts"], GenerationParams(compat="open-dcoder", gen_length=c["gen_length"],
                                                       steps=c["steps"], alg=c["alg"], seed=c["seed"]),
                        suffix=c["suffixes"])


def _want(c):
    n = len(c["prompts"][0])
    return [s[n : n + c["gen_length"]] for s in c["sequences"]]


def test_the_release_loads_as_open_dcoder(models):
    for llm in models.values():
        a = llm.arch
        assert (a.family, a.kind, a.logit_shift, a.qkv_bias) == ("open_dcoder", "full", 1, True)
        assert llm.token_ids.mask == 319  # the tokenizer's [MASK]
    assert models["open-dcoder-pad"].arch.layout.config_pad_id == 317
    assert models["open-dcoder-plain"].arch.layout.config_pad_id is None


@pytest.mark.parametrize("case", range(len(CASES)))
def test_compat_open_dcoder_returns_what_open_dcoder_returned(models, case):
    c = CASES[case]
    out = _run(models[c["checkpoint"]], c)
    assert [r.raw_ids for r in out.results] == _want(c)
    assert out.nfe == c["forwards"]
    if c["infill"]:
        suffix = c["suffixes"][0]
        assert c["sequences"][0][-len(suffix):] == suffix


def test_the_causal_quirk_is_what_the_pad_cases_need(models, monkeypatch):
    """The cases whose prompt holds config.json's pad id decode causally upstream: without that
    rule the port returns other tokens (the cases test it), and it never fires without a pad id."""
    import unmask.reference.open_dcoder as od

    pad_cases = [c for c in CASES if c["checkpoint"] == "open-dcoder-pad" and 317 in c["prompts"][0]]
    assert len(pad_cases) == 2
    monkeypatch.setattr(od, "_attention", lambda model, x: None)
    assert any([r.raw_ids for r in _run(models["open-dcoder-pad"], c).results] != _want(c) for c in pad_cases)


def test_p2_masks_committed_tokens_again(models):
    c = next(c for c in CASES if c["alg"] == "p2")
    out = _run(models[c["checkpoint"]], c)
    assert sum(s.remasked for s in out.steps) > 0


@pytest.mark.parametrize("bad, message", [
    (dict(remasking="random"), "remasking 'random'"),
    (dict(alg="p3"), "alg 'p3'"),
    (dict(policy="threshold"), "policy 'threshold'"),
])
def test_open_dcoder_mode_refuses_what_it_does_not_reproduce(models, bad, message):
    with pytest.raises(UnmaskError, match=message):
        models["open-dcoder-plain"].generate([[1, 2, 3]], dict(compat="open-dcoder", gen_length=8, **bad))


def test_rows_of_one_length(models):
    with pytest.raises(UnmaskError, match="equal-length prompts"):
        models["open-dcoder-plain"].generate([[1, 2, 3], [4, 5]], dict(compat="open-dcoder", gen_length=8))
    with pytest.raises(UnmaskError, match="equal suffix lengths"):
        models["open-dcoder-plain"].generate([[1, 2, 3], [4, 5, 6]], dict(compat="open-dcoder", gen_length=8),
                                             suffix=[[7, 8], [9]])


def test_a_reference_setting_needs_its_reference():
    with pytest.raises(UnmaskError, match="alg 'p2' is a Dream / Open-dCoder algorithm"):
        LLM().generate(["copy : red"], dict(gen_length=8, block_length=8, alg="p2"))
    with pytest.raises(UnmaskError, match="alg_temp 0.5 is a setting of compat open-dcoder"):
        LLM().generate(["copy : red"], dict(gen_length=8, block_length=8, alg_temp=0.5))
    with pytest.raises(UnmaskError, match="attn_implementation 'eager' is a setting of compat dllm-mdlm / dllm-bd3lm"):
        LLM().generate(["copy : red"], dict(gen_length=8, block_length=8, attn_implementation="eager"))


SAMPLED = json.loads((DATA / "sampled-cases.json").read_text())


@pytest.mark.parametrize("case", range(len(SAMPLED)))
def test_compat_open_dcoder_samples_as_open_dcoder_does(models, case):
    """Its recipes with sampling (sample.py's p2 at temperature 0.5 with top_k and alg_temp 0.5,
    the README's maskgit_plus at 0.7, top_p, Gumbel position choice), seeded as
    `torch.manual_seed(seed)` before its call (sampled-cases.json)."""
    c = SAMPLED[case]
    out = models[c["checkpoint"]].generate(c["prompts"], GenerationParams(
        compat="open-dcoder", gen_length=c["gen_length"], steps=c["steps"], alg=c["alg"], seed=c["seed"],
        temperature=c["temperature"], top_p=c["top_p"], top_k=c["top_k"], alg_temp=c["alg_temp"]),
        suffix=c["suffixes"])
    assert [r.raw_ids for r in out.results] == _want(c)
    assert out.nfe == c["forwards"]
