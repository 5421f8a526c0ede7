"""The code models' corpus, tokenizer and training rows (unmask.train.code), on a small
synthetic standard-library folder (CI does not depend on which CPython is installed)."""

import json

import pytest

from unmask import LLM, UnmaskError
from unmask.train import code

SOURCE = '''"""A module."""

import os


def add(a, b):
    """Add."""
    total = a + b
    return total


class Box:
    def __init__(self, items):
        self.items = list(items)

    def size(self):
        return len(self.items)
'''


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("lib")
    (root / "os.py").write_text("import sys\n")
    for i in range(40):
        (root / f"mod_{i}.py").write_text(SOURCE.replace("add", f"add_{i}").replace("Box", f"Box{i}"))
    (root / "test").mkdir()
    (root / "test" / "test_x.py").write_text("x = 1\n")  # test suites are left out
    (root / "bad.py").write_text("print 'python 2'\n")  # does not parse: left out
    return root


def test_corpus_split_and_manifest(root, tmp_path):
    files = code.corpus_files(root)
    assert "test/test_x.py" not in files and "bad.py" not in files and "mod_0.py" in files
    assert {code.split_of(f) for f in files} <= set(code.SPLITS)
    assert code.split_of("mod_0.py") == code.split_of("mod_0.py")  # by path alone
    folder = code.prepare(tmp_path / "corpus", root, vocab_size=400)
    listed = json.loads((folder / "corpus.json").read_text())["files"]
    assert [f["path"] for f in listed] == files and all(len(f["sha256"]) == 64 for f in listed)


def test_tokenizer_cuts_at_line_starts_as_the_whole_text(root, tmp_path):
    """A newline is a token of its own: lines tokenized one by one give the file's tokens, so a
    hole of whole lines has the tokens it had in the file; bytes round-trip."""
    folder = code.prepare(tmp_path / "corpus", root, vocab_size=400)
    rows, tok = code.load_rows(folder, root, "train", 64, 0)
    whole = tok.encode(SOURCE, add_special_tokens=False).ids
    ids, starts = code.encode_lines(tok, SOURCE)
    assert ids == whole and tok.decode(whole) == SOURCE
    assert len(starts) == len(SOURCE.splitlines())
    text = "def f():\n    return 'é ✓'\n"
    assert tok.decode(tok.encode(text, add_special_tokens=False).ids) == text


def test_training_rows(root, tmp_path):
    folder = code.prepare(tmp_path / "corpus", root, vocab_size=400)
    rows, tok = code.load_rows(folder, root, "train", 48, 0, fim_rate=1.0)
    ids = code.special_ids(tok)
    b = rows.batch(6)
    assert b.ids.shape == (6, 48) and (b.ids[:, 0] == ids[code.BOS]).all() and b.prompt_len == 1
    for row in b.ids.tolist():  # prefix-suffix-middle, each marker once, in that order
        at = [row.index(ids[m]) for m in (code.FIM_PREFIX, code.FIM_SUFFIX, code.FIM_MIDDLE)]
        assert at == sorted(at) and at[0] == 1
    state = rows.state()
    again = rows.batch(2)
    rows.set_state(state)
    assert rows.batch(2).ids.tolist() == again.ids.tolist()  # resumable
    plain, _ = code.load_rows(folder, root, "train", 48, 0)
    assert code.FIM_MIDDLE not in tok.decode(plain.batch(4).ids.flatten().tolist(), skip_special_tokens=False)


def test_a_changed_corpus_file_is_refused(root, tmp_path):
    folder = code.prepare(tmp_path / "corpus", root, vocab_size=400)
    listed = json.loads((folder / "corpus.json").read_text())["files"]
    victim = next(f["path"] for f in listed if f["split"] == "train")
    original = (root / victim).read_text()
    try:
        (root / victim).write_text(original + "\n# changed\n")
        with pytest.raises(UnmaskError, match=f"corpus file {victim} differs"):
            code.load_rows(folder, root, "train", 48, 0)
    finally:
        (root / victim).write_text(original)
    with pytest.raises(UnmaskError, match="not a Python standard library folder"):
        code.stdlib_root(tmp_path)


@pytest.mark.parametrize("kind,extra", [("diffusion", ["--span-rate", "0.5"]), ("ar", ["--fim-rate", "0.5"])])
def test_a_code_model_trains_and_loads(root, tmp_path, kind, extra):
    """A tiny run of each kind on the corpus: a checkpoint in the released layout with the
    byte-level BPE tokenizer and the corpus manifest, which the loader reads like any other."""
    from unmask.cli import main

    out = tmp_path / kind
    rc = main(["train", "--out", str(out), "--kind", kind, "--corpus", str(root), "--layers", "1", "--d-model", "32",
               "--heads", "2", "--mlp", "64", "--gen-length", "32", "--batch", "4", "--steps", "2",
               "--eval-every", "2", "--eval-n", "4", "--vocab-size", "400", "--quiet", *extra])
    assert rc == 0
    meta = json.loads((out / "model" / "training.json").read_text())
    assert meta["corpus"]["version"] == code.CORPUS_VERSION and meta["history"][-1]["held_out"]["select_loss"] > 0
    llm = LLM(str(out / "model"))
    assert llm.arch.vocab_size == llm.tokenizer.vocab_size <= 400 and llm.arch.causal == (kind == "ar")
    res = llm.generate("def add(a, b):\n", llm.default_params(gen_length=8)).results[0]
    assert len(res.raw_ids) <= 8
    # infilling: natively for the diffusion model, prefix-suffix-middle (as the twin was trained)
    # for the autoregressive one, whose tokenizer carries the fill-in-the-middle markers
    p = llm.default_params(gen_length=8)
    filled = llm.generate("def add(a, b):\n", p, suffix="    return c\n").results[0]
    tok, ids = llm.tokenizer, llm.token_ids
    assert ids.fim is not None  # (both tokenizers carry the markers; only the causal twin is laid out with them)
    if kind == "ar":
        pre, suf, mid = (tok.token_id(m) for m in (code.FIM_PREFIX, code.FIM_SUFFIX, code.FIM_MIDDLE))
        assert ids.fim == (pre, suf, mid)
        prompt = tok.encode("def add(a, b):\n")
        head = prompt[:1] if prompt[0] == ids.bos else []
        psm = head + [pre] + prompt[len(head):] + [suf] + tok.encode("    return c\n", add_special_tokens=False) + [mid]
        assert filled.raw_ids == llm.generate([psm], p).results[0].raw_ids


def test_an_expand_token_model_trains_from_a_model_without_one_and_its_holes_grow(root, tmp_path):
    """`--span-expand` (DreamOn): the vocabulary gains <|expand|> (the last id; the model started
    from one without it takes its weights, the new token's embedding the mask's), the checkpoint
    names it (config expand_token_id) and its holes grow by default (generation_config)."""
    import torch

    from unmask.cli import main

    tiny = ["--kind", "diffusion", "--corpus", str(root), "--layers", "1", "--d-model", "32", "--heads", "2",
            "--mlp", "64", "--gen-length", "32", "--batch", "4", "--eval-every", "2", "--eval-n", "4",
            "--vocab-size", "400", "--quiet", "--span-rate", "0.5"]
    assert main(["train", "--out", str(tmp_path / "a"), "--steps", "2", *tiny]) == 0
    assert main(["train", "--out", str(tmp_path / "b"), "--steps", "1", "--span-expand", "0.5", "--span-pad", "2",
                 "--lr", "1e-9", "--init-from", str(tmp_path / "a"), *tiny]) == 0
    a, b = LLM(str(tmp_path / "a" / "model")), LLM(str(tmp_path / "b" / "model"))
    expand = b.token_ids.expand
    assert a.token_ids.expand is None and expand == a.arch.vocab_size == b.arch.vocab_size - 1
    assert b.tokenizer.decode([expand], skip_special_tokens=False) == "<|expand|>"
    assert json.loads((tmp_path / "b" / "model" / "config.json").read_text())["expand_token_id"] == expand
    wte = dict(b.model.named_parameters())["model.transformer.wte.weight"]
    assert torch.allclose(wte[expand], wte[b.token_ids.mask], atol=1e-6)
    p = b.default_params(gen_length=8)
    assert p.hole_length == "grow"
    res = b.generate("def add(a, b):\n", p, suffix="    return c\n").results[0]
    assert len(res.raw_ids) <= 8 and expand not in res.raw_ids


def test_code_training_settings_are_checked():
    from unmask.train.trainer import TrainConfig

    with pytest.raises(UnmaskError, match="fim_rate 0.5 must be in"):
        TrainConfig(kind="diffusion", corpus="stdlib", fim_rate=0.5).check()
    with pytest.raises(UnmaskError, match="span_rate 0.5 must be in"):
        TrainConfig(kind="diffusion", span_rate=0.5).check()
    with pytest.raises(UnmaskError, match="span_expand 0.5 must be in"):
        TrainConfig(kind="diffusion", corpus="stdlib", span_expand=0.5).check()
    with pytest.raises(UnmaskError, match="a code model is a diffusion model or its ar twin"):
        TrainConfig(kind="block", corpus="stdlib").check()


def test_held_out_hole_examples(root, tmp_path):
    """Hidden lines of held-out functions, docstrings left out, context within the budget; the
    pieces put back together are the file's own lines."""
    folder = code.prepare(tmp_path / "corpus", root, 400)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for kind in ("single", "multi"):
        exs = code.hole_examples(tok, "train", kind, 20, root=root)
        assert exs
        for e in exs:
            text = (root / e["file"]).read_text()
            assert e["prefix"] + e["middle"] + e["suffix"] in text and e["middle"].strip()
            assert '"""' not in e["middle"]
            assert e["middle_tokens"] == len(tok.encode(e["middle"], add_special_tokens=False))
            assert e["middle_tokens"] + e["context_tokens"] + 1 <= code.HOLE_BUDGET
            lines = e["middle"].count("\n")
            assert lines == 1 if kind == "single" else 2 <= lines <= 4
    assert code.hole_examples(tok, "train", "single", 5, root=root) == code.hole_examples(tok, "train", "single", 5,
                                                                                         root=root)


def test_padded_spans_end_with_end_of_text_inside_the_mask():
    """span_pad: a span row's masked span is its tokens, then 0..span_pad end-of-text tokens (the
    row's later tokens moved right); the loss's targets are that row."""
    import torch

    from unmask.train.data import Batch
    from unmask.train.trainer import TrainConfig, diffusion_loss

    seen = {}

    class Spy(torch.nn.Module):
        config = type("C", (), {"logit_shift": 0})

        def forward(self, ids, positions, key_mask=None, logits_slice=None):
            seen["ids"] = ids.clone()
            return torch.zeros(ids.shape[0], ids.shape[1], 200, requires_grad=True)

    B, G = 64, 12
    row = torch.arange(100, 100 + G)[None].repeat(B, 1)
    b = Batch(ids=row, positions=torch.arange(G)[None].repeat(B, 1), key_mask=None, prompt_len=0,
              answer_len=torch.full((B,), G))
    diffusion_loss(Spy(), b, mask_id=2, t=torch.full((B,), 0.25), gen=torch.Generator().manual_seed(0),
                   span_rate=1.0, span_pad=4, eos_id=1)
    ids = seen["ids"]
    pads = []
    for r in range(B):  # each row: its tokens up to the span, masks, then its tokens moved right
        m = (ids[r] == 2).nonzero().squeeze(-1)
        assert m.numel() >= 3 and (m == torch.arange(int(m[0]), int(m[-1]) + 1)).all()  # one contiguous span
        start, end = int(m[0]), int(m[-1]) + 1
        assert ids[r, :start].tolist() == list(range(100, 100 + start))
        pads.append(end - start - 3)  # the span holds round(0.25 * 12) = 3 tokens, then the padding
        assert ids[r, end:].tolist() == list(range(100 + start + 3, 100 + start + 3 + G - end))
    assert set(pads) == {0, 1, 2, 3, 4}
    with pytest.raises(UnmaskError, match="span_pad 2 must be a non-negative integer, and above 0 only with"):
        TrainConfig(kind="diffusion", corpus="stdlib", span_pad=2).check()
