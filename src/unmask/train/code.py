"""The code corpus of the embedded code models (`default-code` and its autoregressive twin):
CPython's own standard library, a pinned version, split by file; a byte-level BPE tokenizer
trained on the training split; training rows cut from it at line starts.

Corpus: every `.py` file under the standard library of CPython `CORPUS_VERSION` (`Lib/` as the
interpreter installs it), except site-packages and test suites (`test/`, `tests/`,
`idle_test/`) and files that do not parse as Python 3.11. A file's split is fixed by a hash of
its path: `test` (held out, reported), `select` (held out, used to choose settings) and `train`.
The manifest (`corpus.json`, written beside the model) lists every file with its sha256.

Tokenizer: byte-level BPE (the `tokenizers` library, saved as the released `tokenizer.json`),
with a newline always a token of its own, so text cut at line starts tokenizes piece by piece as
it does whole: a hole of whole lines has the same tokens as the lines had in the file (an
infilling prompt's prefix and suffix are tokenized alone). Special tokens: the task suite's four
and the fill-in-the-middle markers the autoregressive twin is trained with.
"""

import ast
import hashlib
import json
import random
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from unmask.errors import UnmaskError
from unmask.train.data import BOS, EOS, SPECIALS, Batch

CORPUS = "cpython-stdlib"
CORPUS_VERSION = "3.11.7"
FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE = "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"
CODE_SPECIALS = SPECIALS + [FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE]
SKIP = {"site-packages", "test", "tests", "idle_test", "__pycache__"}
SPLITS = ("train", "select", "test")


def stdlib_root(root: str | Path | None = None) -> Path:
    """The standard library folder of CPython CORPUS_VERSION: `root`, or the running
    interpreter's when it is that version."""
    if root is None:
        version = ".".join(map(str, sys.version_info[:3]))
        if version != CORPUS_VERSION:
            raise UnmaskError(f"the code corpus is CPython {CORPUS_VERSION}'s standard library; this interpreter is "
                              f"{version}: pass the folder of a {CORPUS_VERSION} Lib/ as the corpus root")
        root = sysconfig.get_paths()["stdlib"]
    root = Path(root)
    if not (root / "os.py").is_file():
        raise UnmaskError(f"corpus root {str(root)!r} is not a Python standard library folder (no os.py)")
    return root


def split_of(rel: str) -> str:
    """A file's split, from its path alone: 1 in 20 `test`, 1 in 20 `select`, the rest `train`."""
    h = int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 20
    return "test" if h == 0 else "select" if h == 1 else "train"


def corpus_files(root: Path) -> list[str]:
    """The corpus's files (paths relative to `root`, sorted)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if set(rel.split("/")[:-1]) & SKIP:
            continue
        try:
            ast.parse(path.read_text(encoding="utf-8"), feature_version=(3, 11))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # grammar-test data, other encodings
        out.append(rel)
    return out


def manifest(root: Path, files: list[str]) -> dict:
    return {"corpus": CORPUS, "version": CORPUS_VERSION, "rule": "Lib/**/*.py without site-packages, test/, tests/, "
            "idle_test/, and files that do not parse as Python 3.11; split by sha1(path) % 20: 0 test, 1 select",
            "files": [{"path": f, "split": split_of(f), "sha256": hashlib.sha256((root / f).read_bytes()).hexdigest()}
                      for f in files]}


def read_split(root: Path, files: list[str], split: str) -> dict[str, str]:
    return {f: (root / f).read_text(encoding="utf-8") for f in files if split_of(f) == split}


def train_tokenizer(texts, vocab_size: int) -> Tokenizer:
    """Byte-level BPE with every newline a token of its own (see the module docstring)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("\n", behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=CODE_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    bos = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, bos)])
    return tok


def encode_lines(tok: Tokenizer, text: str) -> tuple[list[int], list[int]]:
    """A file's token ids and the index of the first token of each line."""
    ids, starts = [], []
    for line in text.splitlines(keepends=True):
        starts.append(len(ids))
        ids += tok.encode(line, add_special_tokens=False).ids
    return ids, starts


@dataclass
class CodeRows:
    """Seeded, resumable training rows from the training split: BOS, then `length - 1` tokens of
    one file from a line start (files weighted by their length; a row that runs past the end of
    its file ends with end-of-text padding). For the autoregressive twin, a share `fim_rate` of
    rows is rewritten prefix-suffix-middle: BOS <fim_prefix> prefix <fim_suffix> suffix
    <fim_middle> middle end-of-text, cut at two random line starts of the row."""

    files: list[tuple[list[int], list[int]]]
    length: int
    ids: dict  # special token ids
    seed: int = 0
    fim_rate: float = 0.0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.weights = [len(ids) for ids, _ in self.files]

    def row(self) -> list[int]:
        ids, starts = self.rng.choices(self.files, self.weights)[0]
        n = self.length - 1
        at = self.rng.choice(starts)
        body = ids[at : at + n]
        if self.fim_rate and self.rng.random() < self.fim_rate:
            return [self.ids[BOS]] + self._fim(body, [s - at for s in starts if at <= s < at + len(body)], n)
        return [self.ids[BOS]] + body + [self.ids[EOS]] * (n - len(body))

    def _fim(self, body: list[int], starts: list[int], n: int) -> list[int]:
        cuts = sorted(self.rng.choice(starts + [len(body)]) for _ in range(2))
        body = body[: n - 4]  # room for the three markers and end-of-text
        a, b = (min(c, len(body)) for c in cuts)
        out = ([self.ids[FIM_PREFIX]] + body[:a] + [self.ids[FIM_SUFFIX]] + body[b:] + [self.ids[FIM_MIDDLE]]
               + body[a:b] + [self.ids[EOS]])
        return out + [self.ids[EOS]] * (n - len(out))

    def batch(self, size: int) -> Batch:
        """`size` rows; the prompt is BOS, the answer the rest (its length: up to the first
        end-of-text, which the autoregressive loss scores and no padding after it)."""
        rows = torch.tensor([self.row() for _ in range(size)])
        positions = torch.arange(self.length).expand(size, -1).clone()
        eos = rows[:, 1:] == self.ids[EOS]
        answer = torch.where(eos.any(1), eos.int().argmax(1), self.length - 1)
        return Batch(rows, positions, None, 1, answer)

    def state(self):
        return self.rng.getstate()

    def set_state(self, state) -> None:
        self.rng.setstate(state)


def special_ids(tok: Tokenizer) -> dict[str, int]:
    return {s: tok.token_to_id(s) for s in CODE_SPECIALS}


def prepare(folder: Path, root: str | Path | None = None, vocab_size: int = 4096) -> Path:
    """The tokenizer and manifest of the corpus in `folder` (made once; a resumed run reuses
    them): tokenizer.json, corpus.json."""
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "tokenizer.json").exists():
        root = stdlib_root(root)
        files = corpus_files(root)
        (folder / "corpus.json").write_text(json.dumps(manifest(root, files), indent=1))
        tok = train_tokenizer(read_split(root, files, "train").values(), vocab_size)
        tok.save(str(folder / "tokenizer.json"))
    return folder


def load_rows(folder: Path, root: str | Path | None, split: str, length: int, seed: int,
              fim_rate: float = 0.0) -> tuple[CodeRows, Tokenizer]:
    """Training (or held-out) rows of `split`, checked against the manifest (a changed file is refused)."""
    root = stdlib_root(root)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    listed = json.loads((folder / "corpus.json").read_text())["files"]
    files = []
    for f in listed:
        if f["split"] != split:
            continue
        data = (root / f["path"]).read_bytes()
        if hashlib.sha256(data).hexdigest() != f["sha256"]:
            raise UnmaskError(f"corpus file {f['path']} differs from the one the manifest lists")
        files.append(encode_lines(tok, data.decode("utf-8")))
    return CodeRows(files, length, special_ids(tok), seed, fim_rate), tok


# ---- held-out holes (benchmarks/code_infill.py, the shipped code models' check) ------------------
# In each function of the files of a held-out split (`select` or `test`, never trained on), one
# hidden line ("single") or a block of 2-4 lines ("multi") of its body, docstrings left out, with
# the lines around it in the file as context, up to HOLE_BUDGET tokens in all (rows were 256).

HOLE_BUDGET = 240


def _doc_lines(fn) -> set[int]:
    first = fn.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return set(range(first.lineno, first.end_lineno + 1))
    return set()


def hole_examples(tok, split: str, kind: str, n: int, seed: int = 0, root: str | Path | None = None) -> list[dict]:
    """Up to n examples of `kind` ("single" or "multi") from the files of `split`: prefix,
    middle (the hidden text), suffix, the middle's and the context's token counts."""
    root = stdlib_root(root)
    files = [f for f in corpus_files(root) if split_of(f) == split]
    rng = random.Random(f"{split}-{kind}-{seed}")
    pool = []
    for rel in files:
        text = (root / rel).read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)
        counts = [len(tok.encode(line, add_special_tokens=False)) for line in lines]
        for fn in ast.walk(ast.parse(text)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or len(fn.body) < 2:
                continue
            skip = _doc_lines(fn)
            body = [i for i in range(fn.body[0].lineno, fn.end_lineno + 1) if i not in skip and lines[i - 1].strip()]
            if not body:
                continue
            k = 1 if kind == "single" else rng.randint(2, 4)
            start = rng.choice(body)
            hole = [i for i in range(start, start + k) if i <= fn.end_lineno]
            if len(hole) < k or any(i in skip for i in hole):
                continue
            a, b = hole[0] - 1, hole[-1]  # 0-based [a, b): the hidden lines
            size = sum(counts[a:b])
            if size < 2 or size > (24 if kind == "single" else 64):
                continue
            lo, hi, used = a, b, size + 1  # grow the context around the hole, before and after in turn
            while True:
                grew = False
                if lo > 0 and used + counts[lo - 1] <= HOLE_BUDGET:
                    lo, used, grew = lo - 1, used + counts[lo - 1], True
                if hi < len(lines) and used + counts[hi] <= HOLE_BUDGET:
                    used, hi, grew = used + counts[hi], hi + 1, True
                if not grew:
                    break
            prefix = "".join(lines[lo:a])
            if not prefix.strip():
                continue
            pool.append({"file": rel, "function": fn.name, "line": a + 1, "prefix": prefix,
                         "middle": "".join(lines[a:b]), "suffix": "".join(lines[b:hi]), "middle_tokens": size,
                         "context_tokens": used - size - 1})
    rng.shuffle(pool)
    return pool[:n]


def hole_matches(llm, e: dict) -> bool:
    """Whether `llm` fills held-out hole `e` exactly (its output's first line against the hidden
    line): the diffusion model given the hole's length, one token per step; the autoregressive
    twin prefix-suffix-middle, greedy (scripts/ship_default.py --code and its test)."""
    from unmask.params import GenerationParams

    if llm.arch.causal:
        p = llm.default_params(gen_length=32)
    else:
        g = e["middle_tokens"]
        p = GenerationParams(gen_length=g, block_length=g, steps=g, early_stop=False)
    text = llm.generate([e["prefix"]], p, chat=False, suffix=[e["suffix"]]).results[0].text
    return text.split("\n")[0] + "\n" == e["middle"]
