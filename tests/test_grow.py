"""Holes that grow and shrink (hole_length "grow", DreamOn's expand and delete; engine/grow.py):
the engine against DreamOn's inference loop written here from its rules, invariants of the
edit, caches against no cache, the training canvas, and the refusals."""

import dataclasses

import pytest
import torch

from unmask import GenerationParams, UnmaskError
from unmask.engine import Engine, EngineConfig
from unmask.engine.grow import START
from unmask.llm import LLM
from unmask.models.base import ArchConfig, DiffusionLM, TokenIds

MASK, EOS, EXPAND = 60, 61, 62
TOKENS = TokenIds(mask=MASK, eos=EOS, pad=EOS, stop=(EOS,), expand=EXPAND)


class GrowModel(DiffusionLM):
    """A model that wants a middle of `want` tokens: prompt tokens lie in [1, 20), the suffix's in
    [20, 30). In a hole of h positions, hole position i proposes the expand token while the hole
    is short (h < want, odd i), end of text past the middle (i >= want), else the token 30 + i;
    confidences differ by position (no ties)."""

    def __init__(self, want: int):
        super().__init__()
        self.config = ArchConfig("llada", 64, 8, 1, 1, 1, 8, 1e4, 1e-5, 4096)
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.want = want

    def forward(self, input_ids, positions, kv=None, kv_start=0, key_mask=None, logits_slice=None):
        B, n = input_ids.shape
        logits = torch.zeros(B, n, 64)
        for b in range(B):
            row = input_ids[b].tolist()
            P = next(j for j, t in enumerate(row) if not 1 <= t < 20)
            end = next((j for j in range(P, n) if 20 <= row[j] < 30), n)
            for j in range(P, end):
                tok, strength = self.propose(j - P, end - P)
                logits[b, j, tok] = strength + ((j * 7) % 11) / 3
        if isinstance(logits_slice, torch.Tensor):
            return logits.gather(1, logits_slice[..., None].expand(-1, -1, 64))
        return logits if logits_slice is None else logits[:, logits_slice]

    def propose(self, i: int, h: int) -> tuple[int, float]:
        """Hole position i of a hole of h positions: its token and a base strength."""
        return (EXPAND if h < self.want and i % 2 else EOS if i >= self.want else 30 + i), 2.0


class CycleModel(GrowModel):
    """Grows a short hole and cuts a long one back: expand at every position while the hole has
    fewer than 6 positions, end of text at its third from 6 on (a cycle only the expand budget
    ends)."""

    def propose(self, i: int, h: int) -> tuple[int, float]:
        tok = EXPAND if h < 6 else EOS if i == 2 else 30 + i
        return tok, 2.0 + (3.0 if tok != 30 + i else 0.0)


def dreamon_infill(model, prefix: list[int], suffix: list[int], bound: int) -> list[int]:
    """DreamOn's `batch_generate_with_expand_as_token` (greedy, one token per step by the highest
    probability among the masks), written from its rules: the hole starts at START masks; the
    expand token is banned once the hole is at its bound or its expand budget (the bound) is
    spent; an end of text ends the hole (it and the masks after it are deleted); an expand token
    becomes two masks."""
    x = prefix + [MASK] * START + suffix
    P, budget = len(prefix), bound
    while True:
        h = len(x) - P - len(suffix)
        masks = [j for j in range(P, P + h) if x[j] == MASK]
        if not masks:
            return x[P : P + h]
        logits = model(torch.tensor([x]), torch.arange(len(x))[None])[0]
        if h >= bound or budget == 0:
            logits[:, EXPAND] = -torch.inf
        prob = torch.softmax(logits, -1)
        conf, tok = prob.max(-1)
        j = max(masks, key=lambda m: float(conf[m]))
        t = int(tok[j])
        if t == EOS:
            x = x[:j] + [v for k, v in enumerate(x[j:P + h], j) if v != MASK and k != j] + x[P + h :]
        elif t == EXPAND:
            x, budget = x[:j] + [MASK, MASK] + x[j + 1 :], budget - 1
        else:
            x[j] = t


def test_expanding_and_deleting_in_a_cycle_ends_with_the_expand_budget():
    model = CycleModel(0)
    p = GenerationParams(gen_length=12, block_length=12, steps=12, hole_length="grow")
    engine = Engine(model, TOKENS, EngineConfig(trace_limit=None))
    req = engine.add_request([1, 2, 3], p, suffix=[21, 22])
    for _ in range(200):
        if not engine.has_unfinished():
            break
        engine.step()
    assert not engine.has_unfinished() and req.canvas == dreamon_infill(model, [1, 2, 3], [21, 22], 12)


def _engine_infill(model, rows: list[tuple[list[int], list[int]]], params) -> list[list[int]]:
    engine = Engine(model, TOKENS, EngineConfig(trace_limit=None))
    reqs = [engine.add_request(p, params, suffix=s) for p, s in rows]
    while engine.has_unfinished():
        engine.step()
    return [r.canvas for r in reqs]


@pytest.mark.parametrize("want,bound", [(9, 16), (2, 16), (12, 8), (4, 4)])
def test_a_growing_hole_decodes_as_dreamon_does(want, bound):
    """Rows of different prompts and suffixes batch together; each decodes as DreamOn's loop does
    alone: the hole grows to the middle the model wants (or to its bound), and shrinks at its end
    of text."""
    model = GrowModel(want)
    rows = [([1, 2, 3], [21, 22]), ([4, 5, 6, 7, 8], [23]), ([9], [24, 25, 26, 27])]
    p = GenerationParams(gen_length=bound, block_length=bound, steps=bound, hole_length="grow")
    got = _engine_infill(model, rows, p)
    for (prefix, suffix), out in zip(rows, got):
        ref = dreamon_infill(model, prefix, suffix, bound)
        assert out == ref
        assert len(out) == min(want, bound) and MASK not in out and EXPAND not in out


def test_a_growing_hole_keeps_its_text_around_it_and_its_committed_prefix():
    """The prompt and the suffix come back unchanged; tokens streamed as committed are never
    taken back (each step's committed prefix extends the last one)."""
    model = GrowModel(11)
    engine = Engine(model, TOKENS, EngineConfig(trace_limit=None))
    p = GenerationParams(gen_length=16, block_length=16, steps=16, hole_length="grow")
    req = engine.add_request([1, 2, 3], p, suffix=[21, 22, 23], watch=True)
    seen: list[int] = []
    while engine.has_unfinished():
        for o in engine.step():
            assert o.committed == len(seen) + len(o.new_ids)
            seen += o.new_ids
            assert o.canvas[: len(seen)] == seen  # the streamed prefix starts the canvas as it is now
            assert MASK not in seen and EXPAND not in seen
    assert req.canvas == seen and len(seen) == 11


class Biased(torch.nn.Module):
    """A model with `bias` added to its logits."""

    def __init__(self, inner, bias):
        super().__init__()
        self.inner, self.config, self.bias = inner, inner.config, bias

    def forward(self, *a, **k):
        return self.inner(*a, **k) + self.bias


def _growing(llada) -> LLM:
    """The tiny LLaDA with its last id as the expand token, made likely (so are ends of text)."""
    vocab = llada.arch.vocab_size
    bias = torch.zeros(vocab)
    bias[vocab - 1], bias[llada.token_ids.eos] = 3.0, 1.0
    return LLM.from_parts(Biased(llada.model, bias), llada.tokenizer,
                          dataclasses.replace(llada.token_ids, expand=vocab - 1))


@pytest.mark.parametrize("cache", ["prefix", "dual", "adaptive"])
def test_caches_refreshed_every_step_decode_a_growing_hole_as_no_cache(llada, cache):
    """A real model whose expand token and end of text are likely (their logits raised): caches
    that refresh every step give no cache's tokens; the edit moved the suffix's K/V with it."""
    llm = _growing(llada)
    prompts, suffixes = [[3, 1, 4, 1, 5], [9, 2, 6]], [[7, 8, 9, 7], [5, 3]]
    base = dict(gen_length=16, block_length=16, hole_length="grow", policy="threshold", threshold=0.3)
    ref = llm.generate(prompts, GenerationParams(**base), suffix=suffixes)
    lengths = [len(r.raw_ids) for r in ref.results]
    assert any(n > START for n in lengths)  # the holes did grow
    out = llm.generate(prompts, GenerationParams(**base, cache=cache, refresh_interval=1), suffix=suffixes)
    assert [r.raw_ids for r in out.results] == [r.raw_ids for r in ref.results]


def test_templates_with_several_holes_grow_hole_by_hole(llada):
    """Each hole of a template grows on its own (left to right, as bounded holes do); the fixed
    text between them is kept, and each hole is at most its bound."""
    llm = _growing(llada)
    expand = llm.token_ids.expand
    p = GenerationParams(policy="threshold", threshold=0.3, hole_length="grow", gen_length=8, block_length=8)
    out = llm.infill(["w1 w2 w3 <|hole:6|> w5 w6 <|hole:5|> w7 w8", "w9 <|hole:7|> w4"], p)
    two, one = out.results
    assert len(two.holes) == 2 and len(one.holes) == 1
    assert " w5 w6 " in f" {two.text} " and expand not in two.raw_ids + one.raw_ids
    lengths = [len(llm.tokenizer.encode(h, add_special_tokens=False)) for h in two.holes + one.holes]
    assert all(n <= b for n, b in zip(lengths, (6, 5, 7))) and any(n > START for n in lengths)


def test_a_hole_that_does_not_grow_never_writes_the_expand_token():
    """With hole_length bound or exact, or with no suffix, the expand token is never proposed."""
    model = GrowModel(9)
    for hl in ("bound", "exact"):
        p = GenerationParams(gen_length=8, block_length=8, steps=8, hole_length=hl, early_stop=False)
        for out in _engine_infill(model, [([1, 2, 3], [21, 22])], p):
            assert EXPAND not in out and len(out) == 8


def test_grow_refusals_name_the_setting(llada):
    p = dict(gen_length=8, block_length=8, hole_length="grow")
    with pytest.raises(UnmaskError, match="expand token") as e:  # a model without one
        llada.generate([[1, 2]], GenerationParams(**p), suffix=[[3, 4]])
    assert e.value.param == "hole_length"
    engine = Engine(GrowModel(4), TOKENS, EngineConfig())
    with pytest.raises(UnmaskError, match="dllm-cache") as e:
        engine.add_request([1, 2], GenerationParams(**p, cache="dllm-cache"), suffix=[21])
    assert e.value.param == "cache"
    with pytest.raises(UnmaskError, match="revises") as e:
        engine.add_request([1, 2], GenerationParams(**p, policy="edit"), suffix=[21])
    assert e.value.param == "policy"
    with pytest.raises(UnmaskError, match="hole_length 'grow'"):
        llada.generate([[1, 2]], GenerationParams(**p, compat="llada"), suffix=[[3, 4]])


def test_the_training_canvas_squeezes_spans_into_expand_tokens():
    """DreamOn's training canvas (train/trainer.py expand_span): each expand-token position stands
    for a run of two or more hidden tokens, the span's other tokens read back in order, its
    hidden end-of-text padding follows it, the row's later tokens follow that, and a row that is
    not squeezed hides its whole span (the plain span objective, padded)."""
    from unmask.train.trainer import expand_span

    gen = torch.Generator().manual_seed(3)
    B, G = 64, 40
    region = torch.arange(100, 100 + G).repeat(B, 1)
    start = torch.randint(0, 10, (B,), generator=gen)
    end = start + torch.randint(1, 20, (B,), generator=gen)
    pad = torch.randint(0, 4, (B,), generator=gen)
    squeeze = torch.rand(B, generator=gen) < 0.7
    t = torch.rand(B, generator=gen)
    out, hidden, valid = expand_span(region, start, end, pad, squeeze, t, EOS, EXPAND, gen)
    expanded = 0
    for b in range(B):
        s, e, row, hid = int(start[b]), int(end[b]), out[b].tolist(), hidden[b].tolist()
        assert row[:s] == list(range(100, 100 + s)) and not any(hid[:s])
        j, cur, run = s, 100 + s, 0  # walk the hole: `run` expand positions since the last token
        while cur < 100 + e or run:
            if j < G and row[j] == EXPAND:
                assert hid[j] and squeeze[b]
                run, j = run + 1, j + 1
                continue
            nxt = row[j] if j < G and 100 <= row[j] < 100 + e else 100 + e
            assert nxt - cur >= 2 * run and (run or nxt == cur)  # each expand position: two or more tokens
            expanded += run
            if nxt == 100 + e:
                break
            assert squeeze[b] or hid[j]
            cur, run, j = nxt + 1, 0, j + 1
        assert row[j : j + int(pad[b])] == [EOS] * int(pad[b]) and all(hid[j : j + int(pad[b])])
        j += int(pad[b])
        n = int(valid[b].sum())
        assert row[j:n] == list(range(100 + e, 100 + e + n - j)) and not any(hid[j:])
    assert expanded > 0


def test_squeezed_holes_are_whole_lines():
    """line_span: a hole starts at a line start and ends after a newline (1-4 lines), at most
    EXPAND_SPAN tokens; a line longer than that is cut to its first EXPAND_SPAN tokens."""
    import random

    from unmask.train.trainer import EXPAND_SPAN, line_span

    NL, rng = 9, random.Random(0)
    rows = []
    for b in range(32):
        r: list[int] = []
        while len(r) < 200:
            r += [rng.randint(10, 30) for _ in range(rng.randint(1, 90 if b == 0 else 25))] + [NL]
        rows.append(r[:200])
    region = torch.tensor(rows)
    start, end = line_span(region, NL, torch.Generator().manual_seed(0))
    for b in range(32):
        s, e, row = int(start[b]), int(end[b]), rows[b]
        assert s == 0 or row[s - 1] == NL
        assert 0 < e - s <= EXPAND_SPAN
        lines = row[s:e].count(NL)
        assert (row[e - 1] == NL and 1 <= lines <= 4) or e - s == EXPAND_SPAN or e == 200
