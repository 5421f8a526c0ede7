"""Which grammar engine structured output runs on, chosen by measurement: llguidance, xgrammar
and outlines-core (whichever are installed; only llguidance is a dependency) on the tokenizers
unmask loads, on this CPU.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/grammar_engines.py [--out benchmarks/results/grammar_engines.json]

Tokenizers: the embedded models' word-level vocabulary (139 words; its text joins words with
spaces, so every token is " word"), the code model's byte-level BPE (4,096) and a byte-level BPE
of 32,768 trained here on the Python standard library (the kind LLaDA's, Dream's and Qwen's
126-152k vocabularies are; mask cost grows with the vocabulary). Each engine gets the same token
bytes (unmask.constrain.vocab). Constraints: a nested JSON schema, a regex (an e-mail-like
pattern) and a choice of five strings; each engine walks the same valid answer (the answer text
tokenised by the model's tokenizer) and at each position computes the next-token mask, then
advances by the answer's token. Reported per engine, tokenizer and constraint: compile seconds
(vocabulary preparation and grammar compile, first time), mean microseconds per mask and per
advance, and whether the engine accepted the answer. Writes JSON."""

import argparse
import glob
import json
import os
import sysconfig
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from unmask import LLM  # noqa: E402
from unmask.bench.runner import context  # noqa: E402
from unmask.constrain import Constraint, GrammarVocab  # noqa: E402
from unmask.constrain.vocab import vocab_bytes  # noqa: E402
from unmask.files import write_json_atomic  # noqa: E402

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0},
    "tags": {"type": "array", "items": {"enum": ["red", "blue", "green"]}},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city"]}}, "required": ["name", "age", "tags", "address"], "additionalProperties": False}
ANSWERS = {  # (byte-level answer, word-level answer) per constraint
    "json": ('{"name": "ann", "age": 42, "tags": ["red", "blue"], "address": {"city": "rome", "zip": "00184"}}',
             '{ "name" : "ann" , "age" : 4 , "pet" : "cat" , "score" : { "city" : "rome" } }'),
    "regex": ("ann.smith@example.com", None),
    "choice": ("green", "green"),
}
WORD_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                                "pet": {"enum": ["cat", "dog"]},
                                                "score": {"type": "object", "properties": {"city": {"type": "string"}}}},
               "required": ["name", "age", "pet", "score"], "additionalProperties": False}
REGEX = r"[a-z]+(\.[a-z]+)?@[a-z]+\.(com|org|net)"
CHOICES = ["red", "blue", "green", "black", "white"]


def big_bpe(path: str, size: int = 32768):
    """A byte-level BPE of `size` trained on the standard library's Python files (cached)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if os.path.exists(path):
        return Tokenizer.from_file(path)
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py"), recursive=True))[:1500]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    def texts():
        for f in files:
            try:
                yield open(f, encoding="utf-8").read()
            except (UnicodeDecodeError, OSError):
                continue

    tok.train_from_iterator(texts(), trainers.BpeTrainer(vocab_size=size, show_progress=False,
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                         special_tokens=["<|endoftext|>"]))
    tok.save(path)
    return tok


class _Tok:
    """What GrammarVocab reads of a tokenizer (unmask.tokenizer.Tokenizer's `tok`)."""

    def __init__(self, tok) -> None:
        self.tok = tok


def constraint(kind: str, word: bool) -> Constraint:
    if kind == "json":
        return Constraint.json_schema(WORD_SCHEMA if word else SCHEMA)
    return Constraint.regex(REGEX) if kind == "regex" else Constraint.choice(CHOICES)


def run_llguidance(tok, eos: int, c: Constraint, ids: list[int]) -> dict:
    t0 = time.perf_counter()
    v = GrammarVocab(_Tok(tok), [eos], tok.get_vocab_size(with_added_tokens=True))
    prep = time.perf_counter() - t0
    t0 = time.perf_counter()
    m = v.matcher(v.compile(c))
    compile_s = time.perf_counter() - t0
    bm = v.bitmask(1)
    masks, adv, ok = [], [], True
    for t in ids:
        t0 = time.perf_counter()
        v.fill([m], bm)
        masks.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ok &= bool(m.consume_token(t))
        adv.append(time.perf_counter() - t0)
    return {"prepare_s": prep, "compile_s": compile_s, "mask_us": 1e6 * float(np.mean(masks)),
            "advance_us": 1e6 * float(np.mean(adv)), "accepted": ok and m.is_accepting()}


def run_xgrammar(tok, eos: int, c: Constraint, ids: list[int], vb) -> dict:
    import xgrammar as xgr

    t0 = time.perf_counter()
    info = xgr.TokenizerInfo(vb.tokens, xgr.VocabType.RAW, vocab_size=len(vb.tokens), stop_token_ids=[eos])
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    prep = time.perf_counter() - t0
    t0 = time.perf_counter()
    if c.kind == "json":
        g = xgr.Grammar.from_json_schema(c.value, any_whitespace=vb.space_joined,
                                         separators=None if vb.space_joined else (", ", ": "))
    else:
        g = xgr.Grammar.from_regex(c.value if c.kind == "regex" else "|".join(json.loads(c.value)))
    if vb.space_joined:  # the text of " word" tokens starts with a space, as unmask compiles it for llguidance
        g = xgr.Grammar.concat(xgr.Grammar.from_regex(" "), g)
    g = compiler.compile_grammar(g)
    compile_s = time.perf_counter() - t0
    m = xgr.GrammarMatcher(g)
    bm = xgr.allocate_token_bitmask(1, info.vocab_size)
    masks, adv, ok = [], [], True
    for t in ids:
        t0 = time.perf_counter()
        m.fill_next_token_bitmask(bm)
        masks.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ok &= bool(m.accept_token(t))
        adv.append(time.perf_counter() - t0)
    return {"prepare_s": prep, "compile_s": compile_s, "mask_us": 1e6 * float(np.mean(masks)),
            "advance_us": 1e6 * float(np.mean(adv)), "accepted": ok and bool(m.accept_token(eos))}


def run_outlines(tok, eos: int, c: Constraint, ids: list[int], vb) -> dict:
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    t0 = time.perf_counter()
    entries: dict = {}
    for i, b in enumerate(vb.tokens):
        if b and i not in vb.special and i != eos:
            entries.setdefault(b, []).append(i)
    vocab = Vocabulary(eos, {k: v for k, v in entries.items()})
    prep = time.perf_counter() - t0
    if c.kind == "json":
        ws = r"[ ]?" if vb.space_joined else None
        regex = build_regex_from_schema(c.value, ws) if ws else build_regex_from_schema(c.value)
    else:
        regex = c.value if c.kind == "regex" else "|".join(json.loads(c.value))
    if vb.space_joined:
        regex = " (" + regex + ")"
    t0 = time.perf_counter()
    index = Index(regex, vocab)
    compile_s = time.perf_counter() - t0
    guide = Guide(index)
    masks, adv, ok = [], [], True
    for t in ids:
        t0 = time.perf_counter()
        allowed = guide.get_tokens()
        masks.append(time.perf_counter() - t0)
        ok &= t in allowed
        t0 = time.perf_counter()
        if t in allowed:
            guide.advance(t)
        adv.append(time.perf_counter() - t0)
    return {"prepare_s": prep, "compile_s": compile_s, "mask_us": 1e6 * float(np.mean(masks)),
            "advance_us": 1e6 * float(np.mean(adv)), "accepted": ok and guide.is_finished()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results/grammar_engines.json")
    ap.add_argument("--bpe-cache", default="/tmp/unmask-bpe32k.json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    vocabs = [("word-level 139 (embedded)", LLM("default").tokenizer.tok, 1),
              ("byte-level BPE 4096 (default-code)", LLM("default-code").tokenizer.tok, None),
              ("byte-level BPE 32768 (stdlib-trained)", big_bpe(a.bpe_cache), None)]
    rows = []
    for name, tok, eos in vocabs:
        vb = vocab_bytes(tok)
        eos = eos if eos is not None else tok.token_to_id("<|endoftext|>")
        for kind in ("json", "regex", "choice"):
            text = ANSWERS[kind][1 if vb.space_joined else 0]
            if text is None:
                continue
            ids = tok.encode(text, add_special_tokens=False).ids + [eos]
            ids_no_eos = ids[:-1]
            c = constraint(kind, vb.space_joined)
            for engine, run in (("llguidance", lambda: run_llguidance(tok, eos, c, ids_no_eos)),
                                ("xgrammar", lambda: run_xgrammar(tok, eos, c, ids_no_eos, vb)),
                                ("outlines-core", lambda: run_outlines(tok, eos, c, ids_no_eos, vb))):
                try:
                    got = run()
                except ImportError as e:
                    got = {"error": f"not installed ({e.name})"}
                except Exception as e:  # an engine's own failure is a result, not a crash
                    got = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                row = {"vocabulary": name, "size": len(vb.tokens), "constraint": kind, "engine": engine,
                       "tokens": len(ids_no_eos), **got}
                rows.append(row)
                print(json.dumps(row))
    write_json_atomic(a.out, {"context": context(), "threads": 1, "rows": rows,
                              "note": "mask = the next-token mask of one request at each position of the answer; "
                                      "advance = consuming the answer's token; compile = the grammar for this "
                                      "vocabulary (after the vocabulary was prepared, prepare_s)"})


if __name__ == "__main__":
    main()
