"""Loader strictness and tokenizer/config handling on folders in the released layouts."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from checkpoints import write_llada
from unmask import LLM, CheckpointError
from unmask.models import load_model


@pytest.fixture
def folder(tmp_path):
    return write_llada(tmp_path / "m", shards=2)


def _edit_shard(folder, fn):
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shard = folder / sorted(set(index["weight_map"].values()))[0]
    tensors = load_file(str(shard))
    fn(tensors, index)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def test_sharded_and_single_file_layouts_load_the_same(folder, tmp_path):
    sharded, _ = load_model(folder)
    single = tmp_path / "single"
    shutil.copytree(folder, single)
    tensors = {}
    for f in single.glob("model-*.safetensors"):
        tensors.update(load_file(str(f)))
        f.unlink()
    (single / "model.safetensors.index.json").unlink()
    save_file(tensors, str(single / "model.safetensors"), metadata={"format": "pt"})
    one, _ = load_model(single)
    for (k, a), (k2, b) in zip(sharded.state_dict().items(), one.state_dict().items()):
        assert k == k2 and torch.equal(a, b)


def test_parameter_names_equal_checkpoint_keys(folder):
    model, _ = load_model(folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert set(model.state_dict()) == set(index["weight_map"])


def test_missing_folder_and_config(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="config.json"):
        load_model(tmp_path / "empty")


def test_unknown_model_type(folder):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(model_type="gpt2", architectures=["GPT2LMHeadModel"])
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="unknown model_type 'gpt2'"):
        load_model(folder)


def test_unsupported_option_is_named(folder):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["alibi"] = True
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="alibi"):
        load_model(folder)


def test_missing_key(folder):
    def drop(t, index):
        k = next(iter(t))
        del t[k]
        del index["weight_map"][k]

    _edit_shard(folder, drop)
    with pytest.raises(CheckpointError, match="missing weights model.transformer"):
        load_model(folder)


def test_index_lists_a_key_its_shard_lacks(folder):
    _edit_shard(folder, lambda t, index: t.pop(next(iter(t))))
    with pytest.raises(CheckpointError, match="does not contain weight"):
        load_model(folder)


def test_unexpected_key(folder):
    def add(t, index):
        t["model.transformer.extra.weight"] = torch.zeros(2)
        index["weight_map"]["model.transformer.extra.weight"] = index["weight_map"][next(iter(t))]

    _edit_shard(folder, add)
    with pytest.raises(CheckpointError, match="unexpected weights model.transformer.extra.weight"):
        load_model(folder)


def test_shape_mismatch(folder):
    def shrink(t, index):
        k = next(k for k in t if k.endswith("q_proj.weight"))
        t[k] = t[k][:-1]

    _edit_shard(folder, shrink)
    with pytest.raises(CheckpointError, match=r"q_proj.weight' has shape \(31, 32\), expected \(32, 32\)"):
        load_model(folder)


def test_missing_shard_and_bad_shard_name(folder):
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    k = next(iter(index["weight_map"]))
    index["weight_map"][k] = "../evil.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="not a plain file name"):
        load_model(folder)
    index["weight_map"][k] = "model-00009-of-00009.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="missing shard"):
        load_model(folder)


def test_dtype_choice(folder):
    model, _ = load_model(folder, dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16
    with pytest.raises(CheckpointError, match="unknown dtype 'fp8'"):
        load_model(folder, dtype="fp8")


def test_token_ids_come_from_files(folder):
    llm = LLM(folder)
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    ids = llm.token_ids
    assert ids.mask == vocab["<|mdm_mask|>"] and ids.eos == vocab["<|endoftext|>"]
    assert vocab["<|eot_id|>"] in ids.stop and ids.mask not in ids.stop


def test_mask_id_falls_back_to_tokenizer_and_missing_is_an_error(folder):
    cfg = json.loads((folder / "config.json").read_text())
    mask = cfg.pop("mask_token_id")
    (folder / "config.json").write_text(json.dumps(cfg))
    assert LLM(folder).token_ids.mask == mask
    tok = json.loads((folder / "tokenizer.json").read_text())
    for t in tok["added_tokens"]:
        if t["content"] == "<|mdm_mask|>":
            t["content"] = "<|something|>"
    del tok["model"]["vocab"]["<|mdm_mask|>"]
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(CheckpointError, match="no mask token"):
        LLM(folder)


def test_chat_template_rendered_with_jinja(folder):
    llm = LLM(folder)
    text = llm.tokenizer.apply_chat_template([{"role": "user", "content": "w1 w2"}])
    assert text == "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nw1 w2<|eot_id|>" \
                   "<|start_header_id|>assistant<|end_header_id|>\n\n"
    ids = llm.encode("w1 w2")[0]
    assert ids[0] == llm.tokenizer.token_id("<|startoftext|>") and llm.tokenizer.decode(ids) == "user w1 w2 assistant"


def test_qwen2_style_vocab_and_merges_tokenizer(tmp_path):
    """Dream ships vocab.json + merges.txt (no tokenizer.json): byte-level BPE with added tokens."""
    from unmask.tokenizer import Tokenizer

    vocab = {c: i for i, c in enumerate(["a", "b", "c", "Ġ", "ab", "Ġa", "abc"])}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\nĠ a\nab c\n")
    cfg = {"added_tokens_decoder": {"7": {"content": "<|endoftext|>", "special": True},
                                    "8": {"content": "<|mask|>", "special": True}},
           "eos_token": "<|endoftext|>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.encode("abc a<|mask|>") == [6, 5, 8]
    assert tok.decode([6, 5, 7]) == "abc a"


def test_tied_embeddings_need_no_head_weight(folder):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["weight_tying"] = True
    (folder / "config.json").write_text(json.dumps(cfg))

    def drop_head(t, index):
        index["weight_map"].pop("model.transformer.ff_out.weight")
        t.pop("model.transformer.ff_out.weight", None)

    _edit_shard(folder, drop_head)
    for f in folder.glob("model-*.safetensors"):  # the head may live in the other shard
        t = load_file(str(f))
        if t.pop("model.transformer.ff_out.weight", None) is not None:
            save_file(t, str(f), metadata={"format": "pt"})
    model, _ = load_model(folder)
    x = torch.randint(0, 50, (1, 7))
    pos = torch.arange(7)[None]
    h = model(x, pos, logits_slice=slice(0, 0))
    assert h.shape == (1, 0, model.config.vocab_size)
    wte = model.model.transformer.wte.weight
    logits = model(x, pos)
    # the tied head is the embedding matrix: its logits are hidden @ wte.T
    assert torch.allclose(logits, logits @ torch.linalg.pinv(wte.T) @ wte.T, atol=1e-3)


def test_logit_shift_extension(folder):
    """unmask's own diffusion model keeps its AR twin's alignment (`logit_shift`: 1): the engine
    then reads the logits of position j - 1 for token j, as for Dream."""
    from unmask import GenerationParams

    plain = LLM(folder)
    prompt = [[3, 4, 5]]
    with torch.no_grad():
        logits = plain.model(torch.tensor([prompt[0] + [plain.token_ids.mask]]), torch.arange(4)[None])
    logits[..., plain.token_ids.mask] = float("-inf")  # the engine never proposes MASK
    cfg = json.loads((folder / "config.json").read_text())
    cfg["logit_shift"] = 1
    (folder / "config.json").write_text(json.dumps(cfg))
    shifted = LLM(folder)
    assert shifted.arch.logit_shift == 1 and plain.arch.logit_shift == 0
    # one masked position, one step: the shifted model commits the argmax of the prompt's last position
    out = shifted.generate(prompt, GenerationParams(gen_length=1, block_length=1, early_stop=False))
    assert out.results[0].raw_ids == [int(logits[0, 2].argmax())]
    out = plain.generate(prompt, GenerationParams(gen_length=1, block_length=1, early_stop=False))
    assert out.results[0].raw_ids == [int(logits[0, 3].argmax())]
    for bad in (2, -1, True, "1"):
        cfg["logit_shift"] = bad
        (folder / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(CheckpointError, match="logit_shift"):
            load_model(folder)


def test_loading_builds_modules_without_their_initialisers():
    """A model is built on the meta device and every weight assigned from the checkpoint: its
    modules' random init is skipped (on meta it would go through PyTorch's reference ops and
    import torch._dynamo, over a second of start-up), and the initialisers are back afterwards."""
    import os
    import subprocess
    import sys

    code = ("import sys, torch\nfrom unmask import LLM\nLLM('default')\n"
            "w = torch.empty(4, 4)\ntorch.nn.init.ones_(w)\n"
            "print('torch._dynamo' in sys.modules, bool((w == 1).all()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"})
    assert out.stdout.split() == ["False", "True"], out.stderr[-500:]


def test_float_weights_are_the_files_pages_mapped_copy_on_write(tmp_path):
    """A float32 weight loaded on the CPU is a view of its shard's (or GGUF file's) pages, mapped
    privately: nothing copied at load, and a weight changed in place never reaches the file."""
    from pathlib import Path

    src = write_llada(tmp_path / "m", shards=2)
    shards = sorted(src.glob("*.safetensors"))
    before = [f.read_bytes() for f in shards]
    llm = LLM(src, linear_kernel="default")
    private = lambda f: any(line.endswith(str(f)) and " rw-p " in line  # noqa: E731  (copy-on-write)
                            for line in Path("/proc/self/maps").read_text().splitlines())
    assert all(private(f) for f in shards)
    files = {}
    for f in shards:
        files.update(load_file(f))
    state = llm.model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in files.items())
    with torch.no_grad():
        for p in llm.model.parameters():
            p.add_(1.0)  # this process's copy of the pages
    assert [f.read_bytes() for f in shards] == before
    assert torch.equal(llm.model.state_dict()[next(iter(files))], files[next(iter(files))] + 1.0)
    gguf = Path(__file__).parent / "data" / "gguf-upstream" / "dream-f32.gguf"
    gg = LLM(gguf, linear_kernel="default")
    assert private(gguf) and gg.arch.family == "dream"
