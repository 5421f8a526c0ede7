"""dllm's A2D layouts (unmask.models.a2d): the three bases load strictly and compute the logits of
dllm's own model classes (recorded in tests/data/a2d-upstream by dllm's samplers: see
test_dllm_upstream.py for the token-for-token check); MDLM checkpoints run natively as
full-attention models, BD3LM ones as block models with the exact cache; the block of a known
release comes from its name; what the layout cannot be is refused by name."""

import json
import shutil
from pathlib import Path

import pytest

from unmask import LLM
from unmask.errors import CheckpointError
from unmask.models.a2d import RELEASES

DATA = Path(__file__).parent / "data" / "a2d-upstream"
PROMPTS = [[4, 180, 42, 104, 88], [190, 90, 282]]


def _copy(tmp_path: Path, base: str = "ckpt-qwen3", name: str = "m", **config) -> Path:
    out = tmp_path / name
    shutil.copytree(DATA / base, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(config)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.mark.parametrize("base, bias, qk_norm", [("ckpt-qwen3", False, True), ("ckpt-qwen2", True, False),
                                                 ("ckpt-llama", False, False)])
def test_each_base_loads_as_its_layout(base, bias, qk_norm):
    llm = LLM(DATA / base)
    a = llm.arch
    assert (a.family, a.kind, a.logit_shift, a.qkv_bias, a.qk_norm) == ("a2d", "full", 0, bias, qk_norm)
    assert (llm.token_ids.mask, llm.token_ids.eos) == (319, 318)  # <|mask|> from the tokenizer


def test_mdlm_runs_natively_and_bd3lm_with_the_exact_cache(tmp_path):
    full = LLM(DATA / "ckpt-qwen3")
    assert full.default_params().cache == "dual"  # unmask's fast defaults on a full-attention model
    block = LLM(_copy(tmp_path, block_size=4))
    assert (block.arch.kind, block.arch.block_size) == ("block", 4)
    p = block.default_params(gen_length=16)
    assert (p.cache, p.block_length) == ("exact", 4)
    cached = block.generate(PROMPTS, p)
    plain = block.generate(PROMPTS, block.default_params(gen_length=16, cache="none"))
    assert [r.raw_ids for r in cached.results] == [r.raw_ids for r in plain.results]
    assert sum(s.positions for s in cached.steps) < sum(s.positions for s in plain.steps)
    infill = full.generate([PROMPTS[0]], dict(gen_length=8, block_length=8), suffix=[[190, 90, 282]])
    assert len(infill.results[0].raw_ids) == 8  # text on both sides of a hole: full attention


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_a_known_bd3lm_release_gets_its_training_block_by_name(tmp_path, release):
    """The releases' config.json does not say the block (a training argument): their name does,
    as a folder or in the Hub cache; a config that says one wins."""
    for folder in (tmp_path / release, tmp_path / f"models--dllm-hub--{release}" / "snapshots" / ("a" * 40)):
        shutil.copytree(DATA / "ckpt-qwen3", folder)
        assert LLM(folder).arch.block_size == RELEASES[release]
    assert LLM(_copy(tmp_path, name=f"x/{release}", block_size=8)).arch.block_size == 8
    assert LLM(_copy(tmp_path, name="Qwen3-0.6B-diffusion-mdlm-v0.1")).arch.kind == "full"


@pytest.mark.parametrize("change, message", [
    (dict(model_type="a2d-gpt2", architectures=None), r"unknown model_type 'a2d-gpt2'"),
    (dict(mlp_bias=True), r"A2D \(Llama\) option mlp_bias=true"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), r"A2D \(Llama\) option rope_scaling"),
    (dict(hidden_act="gelu"), r"A2D \(Llama\) option hidden_act='gelu'"),
    (dict(num_hidden_layers=None), r"A2D \(Llama\) config lacks required field 'num_hidden_layers'"),
    (dict(block_size=-4), r"block_size -4"),
])
def test_what_the_layout_cannot_be_is_named(tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        LLM(_copy(tmp_path, "ckpt-llama", **change))


def test_unmask_models_lists_the_a2d_layouts():
    from unmask.models.registry import layouts

    rows = [r for r in layouts() if r[1].startswith("dllm A2D")]
    assert len(rows) == 1 and all(t in rows[0][0] for t in ("a2d-qwen2", "a2d-qwen3", "a2d-llama"))
    assert "dllm-hub/Qwen3-0.6B-diffusion-mdlm-v0.1" in rows[0][1]


def test_the_qwen2_parent_runs_causally_and_open_dcoder_by_its_name(tmp_path):
    """Qwen2.5-Coder as the AR baseline loads as a causal model; Open-dCoder's release carries an
    unchanged Qwen2 config, so its name is what tells: a masked diffusion model, never causal."""
    ar = LLM(_copy(tmp_path, "ckpt-qwen2", model_type="qwen2", architectures=["Qwen2ForCausalLM"]))
    assert (ar.arch.family, ar.arch.kind) == ("qwen2", "causal")
    od = LLM(_copy(tmp_path, "ckpt-qwen2", name="open-dcoder-0.5B", model_type="qwen2",
                   architectures=["Qwen2ForCausalLM"]))
    assert (od.arch.family, od.arch.kind, od.arch.logit_shift) == ("open_dcoder", "full", 1)


def test_an_autoregressive_model_without_a_mask_token_gets_a_spare_id(tmp_path):
    """Qwen2.5's tokenizer has no mask token; the AR model's canvas needs a placeholder it never
    writes: the first id of the embedding no token has (Qwen's padding rows). Without one, refused."""
    folder = _copy(tmp_path, "ckpt-qwen2", model_type="qwen2", architectures=["Qwen2ForCausalLM"])
    tok = json.loads((folder / "tokenizer.json").read_text())
    tok["added_tokens"] = [a for a in tok["added_tokens"] if a["content"] != "<|mask|>"]
    tok["model"]["vocab"].pop("<|mask|>", None)
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg.pop("mask_token")
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    llm = LLM(folder)
    assert llm.token_ids.mask == 319 and llm.arch.kind == "causal"
    out = llm.generate([[4, 5, 6, 7]], dict(gen_length=8))
    assert len(out.results[0].raw_ids) == 8 and 319 not in out.results[0].raw_ids
    tok["model"]["vocab"]["w_extra"] = 319
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(CheckpointError, match="no mask token, and the tokenizer uses every id"):
        LLM(folder)


def test_the_chat_template_renders_as_dllm_renders_it(tmp_path):
    """dllm renders an A2D Qwen model's chat template with enable_thinking false (the empty think
    block the Tiny-A2D models were trained after, and their cards' advice); other families don't."""
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and "
                "enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
    folder = _copy(tmp_path)
    (folder / "chat_template.jinja").write_text(template)
    text = LLM(folder).tokenizer.apply_chat_template([{"role": "user", "content": "w1"}])
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    ar = _copy(tmp_path, "ckpt-qwen3", name="ar", model_type="qwen3", architectures=["Qwen3ForCausalLM"])
    (ar / "chat_template.jinja").write_text(template)
    assert LLM(ar).tokenizer.apply_chat_template([{"role": "user", "content": "w1"}]).endswith("assistant\n")
