"""MDLM and BD3-LM (kuleshov-group): the DiT loader (unmask.models.dit), `compat bd3lms` against
what the BD3-LM repository's own sampler returned (tests/data/bd3lms-upstream, recorded by running
its code outside the project), native decoding with the caches, and the release's missing
tokenizer fetched from the Hub (a stand-in on 127.0.0.1)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from unmask import LLM, GenerationParams
from unmask.errors import CheckpointError, UnmaskError

DATA = Path(__file__).parent / "data" / "bd3lms-upstream"
CASES = json.loads((DATA / "cases.json").read_text())["cases"]
_LLMS: dict[str, LLM] = {}


def _llm(name: str) -> LLM:
    if name not in _LLMS:
        _LLMS[name] = LLM(str(DATA / name))
    return _LLMS[name]


def _params(c: dict, **extra) -> GenerationParams:
    return GenerationParams(compat="bd3lms", gen_length=c["seqlen"] - 1, steps=c["steps"],
                            first_hitting=c["first_hitting"], top_p=None if c["nucleus_p"] == 1.0 else c["nucleus_p"],
                            seed=c["seed"], **extra)


def _case_id(c: dict) -> str:
    return (f"{c['checkpoint'][5:]}-L{c['seqlen']}-T{c['steps']}-{'fh' if c['first_hitting'] else 'ddpm'}"
            f"-p{c['nucleus_p']}-b{c['batch']}-s{c['seed']}")


# the long checkpoint's cases sample 11 times over before failing as the reference failed: slow
_MARKED = [pytest.param(c, id=_case_id(c), marks=[pytest.mark.slow] if c["checkpoint"] == "ckpt-bd3lm-long" else [])
           for c in CASES]


@pytest.mark.parametrize("case", _MARKED)
def test_compat_bd3lms_returns_what_the_reference_returned(case):
    llm = _llm(case["checkpoint"])
    bos = llm.token_ids.bos
    prompts = [[bos]] * case["batch"]
    if case["sequences"] is None:  # every one of the reference's 11 tries stopped for low entropy
        with pytest.raises(UnmaskError, match="11 samples in a row"):
            llm.generate(prompts, _params(case))
        return
    out = llm.generate(prompts, _params(case))
    assert [[bos] + r.raw_ids for r in out.results] == case["sequences"]
    assert out.results[0].nfe == case["forwards"]  # retried samples' forwards included


MDLM_CASES = json.loads((DATA / "mdlm-cases.json").read_text())["cases"]


@pytest.mark.parametrize("case", MDLM_CASES, ids=lambda c: (f"{c['checkpoint'][5:]}-L{c['length']}-T{c['steps']}-"
                                                             f"{c['predictor']}-nr{int(c['noise_removal'])}-"
                                                             f"b{c['batch']}-s{c['seed']}"))
def test_compat_mdlm_returns_what_the_mdlm_repository_returned(case):
    llm = _llm(case["checkpoint"])
    out = llm.generate([[] for _ in range(case["batch"])], GenerationParams(
        compat="mdlm", gen_length=case["length"], steps=case["steps"], predictor=case["predictor"],
        noise_removal=case["noise_removal"], seed=case["seed"]))
    assert [r.raw_ids for r in out.results] == case["sequences"]
    assert out.results[0].nfe == case["forwards"]


def test_compat_mdlm_takes_a_prompt_and_refuses_block_models():
    llm = _llm("ckpt-mdlm")
    p = GenerationParams(compat="mdlm", gen_length=12, steps=16, seed=0)
    out = llm.generate([[62, 5, 6], [62, 9, 9]], p)
    assert all(len(r.raw_ids) == 12 and 63 not in r.raw_ids for r in out.results)
    with pytest.raises(UnmaskError, match="prompt 0 is empty"):  # only a model that samples from nothing
        llm.generate([[]], GenerationParams(gen_length=8, block_length=8))
    with pytest.raises(UnmaskError, match="compat 'mdlm' reproduces"):
        _llm("ckpt-bd3lm-b4").generate([[]], p)
    with pytest.raises(UnmaskError, match="predictor 'ddpm' is a setting of compat mdlm"):
        llm.generate([[62]], GenerationParams(compat="bd3lms", gen_length=31, predictor="ddpm"))


def test_a_retried_sample_is_the_references():
    """The recorded cases include samples the reference drew again after a low-entropy stop."""
    assert any(c["tries"] > 1 and c["sequences"] is not None for c in CASES)


def test_a_prompt_follows_the_bos_and_the_canvas_must_tile():
    llm = _llm("ckpt-bd3lm-b4")
    bos = llm.token_ids.bos
    # a prompt without BOS gets one: the same as giving it
    a = llm.generate([[5, 6, 7], [5, 6, 7]], GenerationParams(compat="bd3lms", gen_length=12, steps=4, seed=1,
                                                               first_hitting=False))
    b = llm.generate([[bos, 5, 6, 7]] * 2, GenerationParams(compat="bd3lms", gen_length=12, steps=4, seed=1,
                                                             first_hitting=False))
    assert [r.raw_ids for r in a.results] == [r.raw_ids for r in b.results]
    assert all(len(r.raw_ids) == 12 for r in a.results)
    with pytest.raises(UnmaskError, match="use gen_length 12"):
        llm.generate([[bos, 5, 6, 7]] * 2, GenerationParams(compat="bd3lms", gen_length=10, steps=4,
                                                             first_hitting=False))


@pytest.mark.parametrize("bad,match", [
    (dict(temperature=0.5), "temperature 0.5"),
    (dict(top_k=5), "top_k 5"),
    (dict(remasking="random"), "remasking 'random'"),
    (dict(cache="exact"), "cache 'exact'"),
])
def test_compat_bd3lms_refuses_what_the_reference_cannot_do(bad, match):
    llm = _llm("ckpt-bd3lm-b4")
    with pytest.raises(UnmaskError, match=match):
        llm.generate([[llm.token_ids.bos]], GenerationParams(compat="bd3lms", gen_length=15, **bad))


def test_first_hitting_is_one_sequence_at_a_time_and_other_families_are_refused():
    llm = _llm("ckpt-bd3lm-b4")
    with pytest.raises(UnmaskError, match="first_hitting samples one sequence at a time"):
        llm.generate([[llm.token_ids.bos]] * 2, GenerationParams(compat="bd3lms", gen_length=15))
    with pytest.raises(UnmaskError, match="compat 'bd3lms' reproduces"):
        LLM().generate(["copy : red"], GenerationParams(compat="bd3lms", gen_length=8))
    with pytest.raises(UnmaskError, match="first_hitting True is a setting of compat bd3lms"):
        llm.generate([[1, 2]], GenerationParams(gen_length=8, block_length=4, first_hitting=True))


def test_native_block_model_cached_equals_uncached_and_int8_runs():
    llm = _llm("ckpt-bd3lm-b8")
    assert (llm.arch.kind, llm.arch.block_size) == ("block", 8)
    prompts = [[62, 5, 9, 11], [62, 40]]
    outs = {}
    for cache in ("none", "exact"):
        r = llm.generate(prompts, GenerationParams(gen_length=16, block_length=8, steps=8, cache=cache))
        outs[cache] = [x.raw_ids for x in r.results]
    assert outs["none"] == outs["exact"]
    assert all(63 not in row for row in outs["none"])  # the mask is never proposed
    q = LLM(str(DATA / "ckpt-bd3lm-b8"), quantize="int8")
    r = q.generate(prompts, GenerationParams(gen_length=16, block_length=8, steps=8, cache="exact"))
    assert all(len(x.raw_ids) == 16 for x in r.results)


def test_native_mdlm_runs_with_policies_and_caches():
    llm = _llm("ckpt-mdlm")
    assert llm.arch.kind == "full"
    base = llm.generate([[62, 5, 9]], GenerationParams(gen_length=16, block_length=8, steps=16, cache="none"))
    fast = llm.generate([[62, 5, 9]], GenerationParams(gen_length=16, block_length=8, policy="threshold",
                                                       threshold=0.9, cache="dual"))
    assert len(base.results[0].raw_ids) == len(fast.results[0].raw_ids) == 16
    assert fast.results[0].nfe <= base.results[0].nfe


def test_logits_equal_a_plain_reading_of_the_weights():
    """One forward against the DiT written out from the checkpoint's tensors (adaLN at sigma 0)."""
    llm = _llm("ckpt-bd3lm-b4")
    w = load_file(str(DATA / "ckpt-bd3lm-b4" / "model.safetensors"))
    w = {k.removeprefix("backbone."): v.float() for k, v in w.items()}
    ids = torch.tensor([[62, 3, 7, 63, 63, 1, 63, 2]])
    d, H = 48, 4
    lin = lambda x, n, bias=True: x @ w[n + ".weight"].T + (w[n + ".bias"] if bias else 0)  # noqa: E731
    t = torch.cat([torch.ones(1, 128), torch.zeros(1, 128)], -1)
    c = torch.nn.functional.silu(lin(torch.nn.functional.silu(lin(t, "sigma_map.mlp.0")), "sigma_map.mlp.2"))
    x = w["vocab_embed.embedding"][ids]
    pos = torch.arange(8).float()
    inv = 1 / 10000 ** (torch.arange(0, d // H, 2).float() / (d // H))
    ang = torch.cat([pos[:, None] * inv] * 2, -1)
    rot = lambda v: v * ang.cos() + torch.cat([-v[..., d // H // 2:], v[..., : d // H // 2]], -1) * ang.sin()  # noqa
    ln = lambda v, n: torch.nn.functional.layer_norm(v, [d]) * w[n + ".weight"]  # noqa: E731
    allowed = (torch.arange(8)[None, :] // 4) <= (torch.arange(8)[:, None] // 4)
    for i in range(2):
        p = f"blocks.{i}"
        sa, ca, ga, sm, cm, gm = lin(c, p + ".adaLN_modulation").chunk(6, -1)
        h = ln(x, p + ".norm1") * (1 + ca) + sa
        q, k, v = lin(h, p + ".attn_qkv", False).view(1, 8, 3, H, d // H).unbind(2)
        q, k, v = rot(q.transpose(1, 2)), rot(k.transpose(1, 2)), v.transpose(1, 2)
        s = (q @ k.transpose(-1, -2)) / (d // H) ** 0.5
        a = torch.softmax(s.masked_fill(~allowed, -torch.inf), -1) @ v
        x = x + ga * lin(a.transpose(1, 2).reshape(1, 8, d), p + ".attn_out", False)
        h = ln(x, p + ".norm2") * (1 + cm) + sm
        x = x + gm * lin(torch.nn.functional.gelu(lin(h, p + ".mlp.0"), approximate="tanh"), p + ".mlp.2")
        sh, sc = lin(c, "output_layer.adaLN_modulation").chunk(2, -1)
    want = lin(ln(x, "output_layer.norm_final") * (1 + sc) + sh, "output_layer.linear")
    got = llm.model(ids, torch.arange(8)[None])
    assert torch.isinf(got[..., 63]).all()
    torch.testing.assert_close(got[..., :63], want[..., :63], rtol=1e-4, atol=1e-4)


def _copy(tmp_path, name="ckpt-bd3lm-b4") -> Path:
    dst = tmp_path / name
    shutil.copytree(DATA / name, dst)
    return dst


@pytest.mark.parametrize("field,value,match", [
    ("time_conditioning", True, "time_conditioning=true"),
    ("attn_backend", "xformers", "attn_backend='xformers'"),
    ("block_size", 0, "block_size 0"),
    ("n_heads", 5, "not a multiple of the 5 attention heads"),
])
def test_the_loader_refuses_configs_it_cannot_run(tmp_path, field, value, match):
    folder = _copy(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg[field] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=match):
        LLM(str(folder))


def test_the_loader_is_strict_about_weights(tmp_path):
    folder = _copy(tmp_path)
    w = load_file(str(folder / "model.safetensors"))
    del w["backbone.blocks.1.adaLN_modulation.bias"]
    save_file(w, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match="adaLN_modulation.bias"):
        LLM(str(folder))


def test_a_release_without_a_tokenizer_takes_gpt2s_from_the_hub(tmp_path, monkeypatch):
    """The releases ship no tokenizer (their cards load GPT-2's): the loader fetches only the
    tokenizer files of openai-community/gpt2 from the Hub (never its weights), and says what to do
    when it cannot."""
    import importlib

    import huggingface_hub.constants
    from hub_standin import HubStandIn, Repo

    folder = _copy(tmp_path)
    tok = {f: (folder / f).read_bytes() for f in ("tokenizer.json", "tokenizer_config.json")}
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / f).unlink(missing_ok=True)
    h = HubStandIn()
    h.repos["openai-community/gpt2"] = Repo({**tok, "config.json": b"{}", "model.safetensors": b"x" * 4096,
                                             "pytorch_model.bin": b"never"})
    for k in ("HF_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    importlib.reload(huggingface_hub.constants)
    try:
        llm = LLM(str(folder))
        assert llm.token_ids.mask == 63 and llm.token_ids.bos == 62
        assert sorted(set(h.downloads())) == ["tokenizer.json", "tokenizer_config.json"]
        ref = _llm("ckpt-bd3lm-b4")
        p = GenerationParams(compat="bd3lms", gen_length=15, steps=20, seed=3)
        assert llm.generate([[62]], p).results[0].raw_ids == ref.generate([[62]], p).results[0].raw_ids
        h.repos.pop("openai-community/gpt2")
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
        importlib.reload(huggingface_hub.constants)
        with pytest.raises(UnmaskError, match="ships no tokenizer; it uses openai-community/gpt2's"):
            LLM(str(folder))
    finally:
        h.close()
        monkeypatch.undo()
        importlib.reload(huggingface_hub.constants)
