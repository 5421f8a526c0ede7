"""Structured output (unmask.constrain, engine/constrained.py): outputs in the language on every
commit policy, cache and row kind, decoding that always ends, the room to finish, refusals by
name, and the autoregressive twin equal to a plain per-token masked greedy loop."""

import json
import random

import pytest
import torch

from checkpoints import write_llada
from unmask import UnmaskError
from unmask.bench.schemas import random_regex, random_schema
from unmask.constrain import Constraint, GrammarVocab, RowGrammar
from unmask.constrain.vocab import vocab_bytes


@pytest.fixture(scope="session")
def bpe_llada(tmp_path_factory):
    """A random LLaDA with a byte-level BPE tokenizer: it knows nothing (adversarial)."""
    from unmask import LLM

    return LLM(str(write_llada(tmp_path_factory.mktemp("bpe-llada"), bpe=True)))


def _vocab(llm):
    return GrammarVocab(llm.tokenizer, llm.token_ids.stop, llm.arch.vocab_size)


TEXTS = ['{"a": [1, 2.5, "x y"]}', "def f(x):\n    return x  # é ü 中文", "  two  spaces ", "a@b.com 2026-12-03"]


def test_token_bytes_join_to_the_decoded_text(bpe_llada, embedded):
    for llm in (bpe_llada, embedded):
        vb, tok = vocab_bytes(llm.tokenizer.tok), llm.tokenizer
        texts = TEXTS if not vb.space_joined else ["json : { \"name\" : \"ann\" }", "copy 1 2 3 :"]
        for text in texts:
            ids = tok.encode(text, add_special_tokens=False)
            joined = b"".join(vb.tokens[i] for i in ids).decode("utf-8")
            assert joined == (" " + tok.decode(ids) if vb.space_joined else tok.decode(ids))
    assert vocab_bytes(bpe_llada.tokenizer.tok).kind == "byte-level"
    assert vocab_bytes(embedded.tokenizer.tok).kind == "word-level"


@pytest.mark.parametrize("make, value, words", [
    (Constraint.json_schema, "{not json", "not JSON"),
    (Constraint.json_schema, "[1, 2]", "must be a JSON object"),
    (Constraint.regex, "", "non-empty"),
    (Constraint.choice, "red", "non-empty list"),
    (Constraint.choice, ["red", ""], "non-empty string"),
    (Constraint.grammar, "  ", "non-empty"),
])
def test_bad_constraints_are_named(make, value, words):
    with pytest.raises(UnmaskError, match=words):
        make(value)
    with pytest.raises(UnmaskError, match="constraint kind 'xml'"):
        Constraint.of("xml", "<a/>")


def test_refusals_by_name(bpe_llada, embedded):
    p = dict(gen_length=16, block_length=16, steps=16)
    cases = [
        (bpe_llada, Constraint.regex("(unclosed"), "rejected by the grammar engine"),
        (bpe_llada, Constraint.grammar("start: undefined_rule"), "rejected by the grammar engine"),
        (bpe_llada, Constraint.json_schema({"type": "object", "properties": {"a": {"type": "nonsense"}}}),
         "rejected by the grammar engine"),
        # the word-level vocabulary writes " word" tokens only: no text of the language can start
        (embedded, Constraint.regex("zzz"), "matches nothing this word-level tokenizer can write"),
        (bpe_llada, Constraint.regex(r"a[^\s\S]b"), "matches nothing this byte-level tokenizer can write"),
        (bpe_llada, Constraint.json_schema({"type": "object", "required": ["alpha", "beta", "gamma"],
                                            "properties": {k: {"type": "string", "minLength": 5} for k in
                                                           ("alpha", "beta", "gamma")}}),
         "no completion within gen_length 16"),
    ]
    for llm, c, words in cases:
        with pytest.raises(UnmaskError, match=words):
            llm.generate(["hello"] if llm is bpe_llada else ["copy 1 2 :"], p, constraint=c, chat=False)
    c = Constraint.choice(["a", "b"])
    with pytest.raises(UnmaskError, match="compat 'llada'"):
        bpe_llada.generate(["hello"], dict(p, compat="llada"), constraint=c)
    with pytest.raises(UnmaskError, match="with a suffix"):
        bpe_llada.generate("hello", p, suffix=" world", constraint=c)


SETTINGS = [
    dict(gen_length=48, block_length=48, steps=48),
    dict(gen_length=48, block_length=16, steps=24, cache="prefix"),
    dict(gen_length=48, block_length=16, policy="threshold", threshold=0.3, cache="dual"),
    dict(gen_length=48, block_length=24, policy="factor", factor=2.0, cache="dllm-cache"),
    dict(gen_length=48, block_length=16, policy="entropy", gamma=0.5, cache="adaptive"),
    dict(gen_length=48, block_length=16, policy="budget", budget=2.0),
    dict(gen_length=48, block_length=16, policy="edit", threshold=0.3, edit_threshold=0.5),
    dict(gen_length=48, block_length=16, policy="remdm", steps=24),
    dict(gen_length=48, block_length=16, steps=24, temperature=1.0, seed=3),  # 2 tokens per step, sampled
]


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: f"{s.get('policy', 'fixed')}-{s.get('cache', 'none')}")
def test_every_policy_and_cache_writes_the_language(bpe_llada, setting):
    """Random schemas and regexes on a model that knows nothing: every output is in the language
    (checked by jsonschema / Python's re, not by the grammar engine), and decoding ends within
    a bounded number of forwards."""
    tok, refused = bpe_llada.tokenizer, 0
    for i in range(6):
        rng = random.Random(100 * len(str(setting)) + i)
        c = Constraint.json_schema(random_schema(rng)) if i % 2 == 0 else Constraint.regex(random_regex(rng))
        try:
            out = bpe_llada.generate([tok.encode("hello " * (i + 1))], setting, constraint=c)
        except UnmaskError as e:
            assert "no completion within" in str(e) or "cannot write some text the language needs" in str(e)
            refused += 1
            continue
        r = out.results[0]
        assert c.matches(r.text), (c.value, r.text)
        assert r.nfe <= 2 * setting["gen_length"] + 8
    assert refused <= 1


def test_row_kinds_full_block_and_autoregressive(embedded, embedded_block, embedded_ar):
    cons = [Constraint.json_schema({"type": "object", "properties": {"name": {"enum": ["ann", "bob"]},
                                                                     "age": {"type": "integer"}},
                                    "required": ["name", "age"], "additionalProperties": False}),
            Constraint.regex(r"[0-9]( [0-9])* \+ [0-9]"), Constraint.choice(["red", "blue", "green"])]
    prompts = ["json : name ann age 4 2", "pick color red sky :", "copy 1 2 3 :"]
    for llm in (embedded, embedded_block, embedded_ar):
        for c in cons:
            out = llm.generate(prompts, llm.default_params(gen_length=32), constraint=c, chat=False)
            for r in out.results:
                assert c.matches(r.text), (llm.path, c.value, r.text)
    # the json task's answer, as the embedded model writes it (two-digit numbers are words apart: a
    # schema's integer can only be one digit; a grammar can say what this vocabulary writes). Numbers
    # are a rule, not one lexeme: llguidance's lexemes are greedy, and "4 2 ," would read " ," as more
    # of the number
    g = Constraint.grammar('start: "{ " item (" , " item)* " }"\nitem: STR " : " (STR | num)\nnum: D (" " D)*\n'
                           'STR: /"[a-z]+"/\nD: /[0-9]/')
    for p in (embedded.default_params(), embedded.default_params(policy="fixed", steps=24)):
        out = embedded.generate(["json : name ann age 4 2 city rome"], p, constraint=g, chat=False)
        assert out.results[0].text == '{ "name" : "ann" , "age" : 4 2 , "city" : "rome" }'


def _masked_greedy(llm, prompt: list[int], c: Constraint, n: int) -> list[int]:
    """A plain constrained greedy loop on an autoregressive model: the whole sequence each step,
    the next token's logits masked by llguidance's matcher (no engine, no cache)."""
    v = _vocab(llm)
    m = v.matcher(v.compile(c))
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            x = torch.tensor([ids])
            logits = llm.model(x, torch.arange(len(ids))[None], None, 0, None, None)[0, -1]
            ok = torch.zeros(logits.shape[-1], dtype=torch.bool)
            allowed = torch.from_numpy(v.allowed(m))[: v.n_text]
            ok[: allowed.numel()] = allowed
            t = int(torch.where(ok, logits, -torch.inf).argmax())
            if t in llm.token_ids.stop:
                break
            assert m.consume_token(t)
            ids.append(t)
    return ids[len(prompt):]


def test_autoregressive_twin_equals_a_masked_greedy_loop(embedded_ar):
    tok = embedded_ar.tokenizer
    for prompt, c in [("copy 4 2 7 :", Constraint.regex(r"[0-9]( [0-9])*")),
                      ("pick color sky sea :", Constraint.choice(["red", "blue", "white"])),
                      ("json : name bob pet cat", Constraint.json_schema({"type": "object"}))]:
        ids = tok.encode(prompt)
        out = embedded_ar.generate([ids], embedded_ar.default_params(gen_length=24), constraint=c)
        assert out.results[0].token_ids == _masked_greedy(embedded_ar, ids, c, 24), prompt


def test_room_to_finish_on_a_short_canvas(bpe_llada):
    """A canvas barely longer than the shortest answer: the answer still ends in the language (the
    plan replaces frontier tokens that would leave no room)."""
    c = Constraint.json_schema({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string"}}},
                                "required": ["a"], "additionalProperties": False})
    v = _vocab(bpe_llada)
    shortest = len(RowGrammar(v, c, 64).plan)
    for extra in (0, 1, 3):
        out = bpe_llada.generate(["hello"], dict(gen_length=shortest + extra, block_length=shortest + extra,
                                                 steps=shortest + extra), constraint=c)
        r = out.results[0]
        assert c.matches(r.text), r.text
        json.loads(r.text)


def test_grammar_state_advance_rules(bpe_llada):
    """RowGrammar.advance: a rejected token is masked again, a frontier token with no room is
    replaced by the plan's, an end of text ends the answer only where the grammar accepts."""
    tok, v = bpe_llada.tokenizer, _vocab(bpe_llada)
    eos = bpe_llada.token_ids.eos
    g = RowGrammar(v, Constraint.regex("ab|abc"), 8)
    a, b, x = (tok.encode(s, add_special_tokens=False)[0] for s in ("a", "b", "x"))
    assert g.advance([a, x, b], 8) == ([a], True) and g.rejected == 1  # x rejected: masked again
    nxt = g.plan[0]
    assert tok.decode([nxt]) == "b"
    # an end of text before the grammar accepts: the plan's token takes the frontier, the next is masked
    assert g.advance([eos, x], 7) == ([nxt], True) and g.forced == 1
    g = RowGrammar(v, Constraint.regex("ab|abc"), 8)
    assert g.advance([a, b, eos, x], 8) == ([a, b, eos], False) and g.finished


def test_speculative_rows_equal_the_constrained_autoregressive_output(embedded_ar):
    """A drafter's block is checked by the target's grammar: the output is the constrained
    autoregressive output token for token, with the shipped drafter and with a random one."""
    from test_dflash import _random_drafter
    from unmask import LLM

    drafters = [LLM("default-ar", draft="default-dflash"),
                LLM.from_parts(embedded_ar.model, embedded_ar.tokenizer, embedded_ar.token_ids,
                               drafter=_random_drafter(embedded_ar.model, block=4))]
    prompts = ["json : name ann age 4 2", "pick color red sky :", "copy 1 2 3 :"]
    for c in [Constraint.json_schema({"type": "object", "properties": {"name": {"enum": ["ann", "bob"]},
                                                                       "age": {"type": "integer"}},
                                      "required": ["name", "age"]}),
              Constraint.regex(r"[0-9]( [0-9])*"), Constraint.choice(["red", "blue", "green"])]:
        plain = embedded_ar.generate(prompts, {"gen_length": 24}, constraint=c, chat=False)
        for spec in drafters:
            out = spec.generate(prompts, {"gen_length": 24}, constraint=c, chat=False)
            assert [r.token_ids for r in out.results] == [r.token_ids for r in plain.results]
            assert all(c.matches(r.text) for r in out.results)
    with pytest.raises(UnmaskError, match="greedy: temperature must be 0"):
        drafters[0].generate(prompts[:1], {"gen_length": 24, "temperature": 1.0}, constraint=c, chat=False)


def test_renoising_rows_are_refused_by_name(tmp_path):
    from checkpoints import write_diffusion_gemma
    from unmask import LLM

    llm = LLM(str(write_diffusion_gemma(tmp_path / "dg")))
    with pytest.raises(UnmaskError, match="renoising rows"):
        llm.generate(["w1 w2"], None, constraint=Constraint.choice(["w1"]), chat=False)


def test_the_mask_along_the_likeliest_continuation_keeps_parallel_commits(embedded):
    """The seeds' "high house": at threshold 0.3 the embedded model commits both words of a pairs
    answer in one forward and, unconstrained, sometimes mixes the two phrases. Constrained to the
    two phrases, the second word's logits are masked after the first's argmax, so the answer
    stays one forward, always valid, with nothing masked again."""
    from unmask.tasks import split_examples

    examples = split_examples("pairs", "selection", 24)
    params = embedded.default_params(policy="threshold", threshold=0.3)
    engine = embedded.engine()
    reqs = [engine.add_request(embedded.encode([ex.prompt], chat=False)[0], params,
                               constraint=Constraint.choice(list(ex.valid))) for ex in examples]
    while engine.has_unfinished():
        engine.step()
    res = [embedded.result_of(q.canvas, q.nfe, q.commits, 0.0, **q.counters()) for q in reqs]
    assert all(r.text in ex.valid for r, ex in zip(res, examples))
    assert all(r.nfe == 1 and r.grammar_rejected == 0 for r in res), [(r.nfe, r.grammar_rejected) for r in res]
    plain = embedded.generate([ex.prompt for ex in examples], params, chat=False)
    assert any(r.text not in ex.valid for r, ex in zip(plain.results, examples))  # the mixtures it avoids


def test_a_repeated_constraint_is_compiled_once_and_states_are_independent(bpe_llada):
    v = _vocab(bpe_llada)
    c = Constraint.regex("ab|abc")
    a, b = v.row(c, 8), v.row(c, 8)
    assert a is not b and a.m is not b.m and a.plan == b.plan and len(v._protos) == 1
    tok = bpe_llada.tokenizer
    ta = tok.encode("a", add_special_tokens=False)[0]
    assert a.advance([ta], 8) == ([ta], False)
    assert b.m.validate_tokens([tok.encode("x", add_special_tokens=False)[0]]) == 0  # b still at the start
    assert b.advance([ta], 8) == ([ta], False) and a.front == b.front == 0
    v.row(c, 9)
    assert len(v._protos) == 2  # the length is part of the key (the plan must fit it)
