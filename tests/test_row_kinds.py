"""One engine, pluggable row kinds (issue 34): a kind the engine has never heard of serves
requests; the token budget holds for every kind; the engine checks prompts itself; unseeded
sampled rows are proposed in one batched call; exactly one class in engine/ has a `step`."""

import ast
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

import unmask.engine.commit as commit_mod
from unmask.engine import ROW_KINDS, Engine, EngineConfig
from unmask.constrain import Constraint
from unmask.engine.kind import Cost, KindContext, Report, Stats, Takes
from unmask.engine.rows import Rows, per_row
from unmask.errors import UnmaskError
from unmask.models.base import ArchConfig, TokenIds
from unmask.models.llada import LLaDAModel
from unmask.params import GenerationParams

V = 64
TOKENS = TokenIds(mask=63, eos=62, pad=62, stop=(62,))


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return LLaDAModel(ArchConfig("llada", V, 32, 2, 4, 4, 64, 10000.0, 1e-5, 512)).eval()


@dataclass
class CountStats(Stats):
    counted: int = 0


@dataclass
class CountRows(Rows):
    nxt: torch.Tensor = per_row()  # the next token the row writes
    made: torch.Tensor = per_row()  # tokens written
    G: torch.Tensor = per_row()  # gen_length


class CountKind:
    """A toy kind: each step a row writes `chunk` tokens counting up from its prompt's last id
    (no model forward), and stops at gen_length or after writing the stop id 62."""

    name = "count-up-test"
    Stats = CountStats
    diagnoses, observer, prefix = False, None, None
    chunk = 3

    @classmethod
    def suits(cls, arch, drafter):
        return arch.kind == "count-up" and drafter is None  # the architecture below selects it

    @classmethod
    def takes(cls, arch, tokens):
        return Takes("counting", suffix="count-up rows write after their prompt only",
                     template="count-up rows write after their prompt only",
                     constraint="count-up rows count; they follow no grammar", fast=False,
                     logprobs="count-up rows have no probabilities", diagnose="count-up rows have no cache")

    @classmethod
    def accept(cls, params, arch, given, engine):
        """It counts: gen_length is its one knob; a policy or cache is refused by name."""
        for name, plain in (("policy", "threshold"), ("cache", "none")):
            if given is not None and name in given and getattr(params, name) != plain:
                raise UnmaskError(f"{name} {getattr(params, name)!r}: count-up rows only count", param=name)
        return replace(params, steps=params.gen_length, block_length=params.gen_length, policy="threshold",
                       cache="none")

    @classmethod
    def screen(cls, given, arch):
        return given

    @classmethod
    def mask_token(cls, arch):
        return None

    def __init__(self, ctx: KindContext) -> None:
        self.rows, self.device = CountRows(ctx.device, 0), ctx.device
        self.answers: dict[str, list[int]] = {}

    def prepare(self, params):
        return None

    def admit(self, reqs):
        self.rows.append(reqs, {"nxt": [q.prompt[-1] + 1 for q in reqs], "made": 0,
                                "G": [q.params.gen_length for q in reqs]})
        for q in reqs:
            self.answers[q.id] = []

    def cost(self):
        return Cost(torch.full((self.rows.n,), 10, dtype=torch.long), self.rows.seq)

    def decode(self, run):
        r, report = self.rows, Report()
        idx = run.nonzero().squeeze(-1)
        for i, nxt, made, G in zip(idx.tolist(), r.nxt[idx].tolist(), r.made[idx].tolist(), r.G[idx].tolist()):
            req = r.reqs[i]
            take = min(self.chunk, G - made)
            new = [min(nxt + j, 62) for j in range(take)]
            if 62 in new:
                new = new[: new.index(62) + 1]
            self.answers[req.id] += new
            done = 62 in new or made + len(new) >= G
            report.row(i, made + len(new), new, 1, [len(new)], done, CountStats(len(new)))
            if done:
                report.answers[i] = self.answers.pop(req.id)
        r.nxt[idx] += self.chunk
        r.made[idx] += self.chunk
        return report

    def remove(self, gone):
        for i in gone:
            self.answers.pop(self.rows.reqs[i].id, None)
        self.rows.remove(gone)


def test_a_row_kind_the_engine_never_heard_of_serves_requests(model):
    ROW_KINDS.register(CountKind)
    try:
        engine = Engine(model, TOKENS, EngineConfig(max_num_batched_tokens=20), kind="count-up-test")
        p = GenerationParams(gen_length=8, steps=8, block_length=8)
        a, b, c = (engine.add_request(prompt, p) for prompt in ([1, 2, 10], [5, 58], [7]))
        outs = engine.step()
        assert [o.request.id for o in outs] == [a.id, b.id]  # the budget (20 positions) runs two rows of 10
        assert outs[0].new_ids == [11, 12, 13] and outs[0].forwards == 1 and outs[0].stats.counted == 3
        assert engine.abort(c.id) and c.finish_reason == "abort"
        while engine.has_unfinished():
            engine.step()
        assert a.canvas == list(range(11, 19)) and a.finish_reason == "length" and a.stats.counted == 8
        assert b.canvas == [59, 60, 61, 62] and b.finish_reason == "stop" and b.committed == 4
        assert a.nfe == 3 and a.commits == [3, 3, 2] and engine.num_running == 0 and engine.rows.n == 0
        # what its requests may carry is the kind's to say (Takes), in its own words
        known = set(engine.requests)
        with pytest.raises(UnmaskError, match="count-up rows write after their prompt only"):
            engine.add_request([1, 2], p, suffix=[5, 6])
        with pytest.raises(UnmaskError, match="they follow no grammar"):
            engine.grammar(Constraint.regex("[0-9]+"), p)
        assert set(engine.requests) == known
    finally:
        del ROW_KINDS["count-up-test"]


@dataclass(frozen=True)
class CountArch(ArchConfig):
    """A new architecture: its models decode as count-up rows."""

    @property
    def kind(self) -> str:
        return "count-up"


def test_a_new_kind_is_one_class_and_its_registration_through_every_front_end(llada):
    """A model whose architecture selects a kind nobody wrote elsewhere: the LLM, its parameters
    and the engine ask the kind (kind_for, accept, takes) and no front end knows its name."""
    from unmask.engine.kind import kind_for
    from unmask.llm import LLM

    ROW_KINDS.register(CountKind)
    try:
        arch = CountArch(**{f: getattr(llada.arch, f) for f in llada.arch.__dataclass_fields__})
        llm = LLM.from_parts(LLaDAModel(arch).eval(), llada.tokenizer, llada.token_ids)
        assert kind_for(arch) == "count-up-test" and llm.takes.label == "counting"
        out = llm.generate([[3, 4, 5]], {"gen_length": 4})
        assert out.results[0].token_ids == [6, 7, 8, 9] and out.results[0].nfe == 2
        assert llm.engine().kind.name == "count-up-test"
        with pytest.raises(UnmaskError, match="policy 'fixed': count-up rows only count"):
            llm.generate([[3, 4, 5]], {"gen_length": 4, "policy": "fixed"})
        for call, match in ((lambda: llm.generate([[3]], {"gen_length": 4}, suffix=[[7]]), "after their prompt only"),
                            (lambda: llm.generate([[3]], {"gen_length": 4}, logprobs=1), "no probabilities"),
                            (lambda: llm.takes.need("diagnose"), "count-up rows have no cache")):
            with pytest.raises(UnmaskError, match=match):
                call()
        # a drafter selects no kind for this architecture: refused by name
        with pytest.raises(UnmaskError, match="no row kind decodes a count-up llada model with a drafter"):
            kind_for(arch, drafter=object())
    finally:
        del ROW_KINDS["count-up-test"]
    with pytest.raises(UnmaskError, match="no row kind decodes a count-up llada model"):
        kind_for(arch)


def test_unknown_row_kind_is_refused_by_name(model):
    with pytest.raises(UnmaskError, match="unknown row kind 'nope'"):
        Engine(model, TOKENS, kind="nope")


def test_the_engine_checks_prompts_itself(model):
    engine = Engine(model, TOKENS)
    with pytest.raises(UnmaskError, match="mask token"):
        engine.add_request([1, 63, 2], GenerationParams(gen_length=8, steps=8, block_length=8))
    with pytest.raises(UnmaskError, match="outside the vocabulary"):
        engine.add_request([1, 99], GenerationParams(gen_length=8, steps=8, block_length=8))
    with pytest.raises(UnmaskError, match="maximum of 512 positions"):
        engine.add_request([1] * 510, GenerationParams(gen_length=8, steps=8, block_length=8))
    assert not engine.requests and not engine.has_unfinished()


def test_unseeded_sampled_rows_are_proposed_in_one_call_and_seeded_rows_alone(model, monkeypatch):
    calls = []
    real = commit_mod.propose

    def counting(logits, cfg, generator=None, *a, **k):
        calls.append((logits.shape[0], generator is not None))
        return real(logits, cfg, generator, *a, **k)

    monkeypatch.setattr(commit_mod, "propose", counting)
    p = GenerationParams(gen_length=8, steps=8, block_length=8, temperature=0.7)
    engine = Engine(model, TOKENS)
    for i in range(4):
        engine.add_request([1 + i, 2, 3], p)
    engine.step()
    assert calls == [(4, False)]  # four unseeded rows: one batched proposal
    calls.clear()
    seeded = [engine.add_request([9, 9], replace(p, seed=s)) for s in (1, 2)]
    engine.step()
    assert sorted(calls) == [(1, True), (1, True), (4, False)]
    # a seeded row's output does not depend on the others
    while engine.has_unfinished():
        engine.step()
    alone = Engine(model, TOKENS)
    q = alone.add_request([9, 9], replace(p, seed=1))
    while alone.has_unfinished():
        alone.step()
    assert q.canvas == seeded[0].canvas


def test_exactly_one_class_in_engine_has_a_step():
    """(typing protocols that describe the surface aside)"""
    root = Path(__import__("unmask.engine", fromlist=["x"]).__file__).parent
    owners = []
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            protocol = isinstance(node, ast.ClassDef) and any(getattr(b, "id", None) == "Protocol" for b in node.bases)
            if isinstance(node, ast.ClassDef) and not protocol and any(
                    isinstance(f, ast.FunctionDef) and f.name == "step" for f in node.body):
                owners.append(f"{path.name}:{node.name}")
    assert owners == ["engine.py:Engine"]


def test_kv_rows_live_in_slots_joins_and_leaves_copy_no_cache(model):
    """A departing row's slot takes the last row (its K/V move, nothing else's); a joining row
    takes a free slot of the same store; the outputs equal each request decoded alone."""
    p = GenerationParams(gen_length=16, steps=16, block_length=8, cache="dual")
    prompts = [[1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11, 12]]
    alone = []
    for q in prompts:
        e = Engine(model, TOKENS)
        r = e.add_request(q, p)
        while e.has_unfinished():
            e.step()
        alone.append(r.canvas)
    engine = Engine(model, TOKENS)
    reqs = [engine.add_request(q, p) for q in prompts[:3]]
    engine.step()
    store = engine.rows.slots.groups["k"][0]
    last_k = engine.rows.k[0][2].clone()
    assert engine.abort(reqs[1].id)
    assert engine.rows.reqs == [reqs[0], reqs[2]]  # the last row moved into the freed slot
    assert torch.equal(engine.rows.k[0][1], last_k) and engine.rows.slots.groups["k"][0] is store
    reqs.append(engine.add_request(prompts[3], p))
    engine.step()  # the new row takes the free slot: same store, no copy of the others' K/V
    assert engine.rows.slots.groups["k"][0] is store and engine.rows.n == 3
    while engine.has_unfinished():
        engine.step()
    assert [reqs[i].canvas for i in (0, 2, 3)] == [alone[i] for i in (0, 2, 3)]
    assert engine.rows.k is None and not engine.rows.slots.groups  # freed with the last row


def _count_reads(monkeypatch, engine) -> tuple[list, list]:
    """One engine step with every read-back a tensor offers counted."""
    reads = []
    for name in ("tolist", "item", "__bool__", "__int__", "__float__", "nonzero"):
        real = getattr(torch.Tensor, name)

        def counting(self, *a, _real=real, _name=name, **k):
            reads.append(_name)
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counting)
    try:
        outs = engine.step()
    finally:
        monkeypatch.undo()
    return reads, outs


def test_a_steady_masked_step_reads_back_once(model, monkeypatch):
    """The host reads of a steady cached step (every row in one window forward), counted over
    every read-back a tensor offers: one, the step's report (each row's counts and its open
    block's tokens, each forward's counts) with the next step's plan sizes. A step after a join
    reads its new plan's sizes first."""
    p = GenerationParams(gen_length=32, steps=32, block_length=16, cache="dual", policy="fixed")
    engine = Engine(model, TOKENS)
    reqs = [engine.add_request(q, p) for q in ([1, 2, 3], [4, 5, 6, 7], [8, 9], [10, 11, 12])]
    streamed = {q.id: [] for q in reqs}
    reads, outs = _count_reads(monkeypatch, engine)  # admission and the first (full) forward
    assert reads == ["tolist", "tolist"], reads
    for o in outs:
        streamed[o.request.id] += o.new_ids
    reads, outs = _count_reads(monkeypatch, engine)
    assert engine.trace[-1].kind == "window" and engine.trace[-1].rows == 4
    assert reads == ["tolist"], reads
    late = engine.add_request([1, 2], p)
    reads, more = _count_reads(monkeypatch, engine)  # a join: its plan is read before it runs
    assert reads.count("tolist") == 2, reads  # (and each of the two forwards finds its rows)
    outs = [o for o in outs + more if o.request is not late]
    engine.abort(late.id)
    while outs:  # the ids streamed from the report's block tokens are the canvas, in order
        for o in outs:
            streamed[o.request.id] += o.new_ids
        outs = engine.step()
    assert all(streamed[q.id] == q.canvas[: q.committed] and q.committed == 32 for q in reqs)
