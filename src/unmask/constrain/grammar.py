"""llguidance behind unmask's constraints: one `GrammarVocab` per model (the tokenizer as
llguidance sees it, built once; here), one `RowGrammar` per constrained request (row.py).

A RowGrammar holds the grammar state of the request's validated prefix (the answer's tokens from
its start up to the frontier, the first position not yet checked) and a *plan*: a token sequence
that completes the validated prefix to a word of the language within the room left on the
canvas. The plan is what makes a fixed-length canvas safe: a token is accepted at the frontier
only if a completion of the new prefix is found that fits (the plan's own next token always
fits), so the answer can always end in an accepting state before the canvas runs out. The
completion search (`complete`) is greedy over llguidance's token masks, preferring tokens that
close structure (quotes, brackets), then punctuation, digits and letters, whitespace last; it is
not exhaustive, so a prefix whose completion it misses is refused although one may exist (it
never accepts one that cannot finish)."""

import json
import threading
from collections import OrderedDict

import numpy as np
import torch

from unmask.constrain.row import RowGrammar
from unmask.constrain.spec import Constraint
from unmask.constrain.vocab import vocab_bytes
from unmask.errors import UnmaskError

_CLASSES = 8


def _rank_key(raw: bytes) -> tuple:
    """The completion search's preference: brackets that close, quotes, separators, other
    punctuation and spaces, zero, digits, letters, anything else; shorter first."""
    text = raw.lstrip(b" ")
    if not text:  # spaces only: with punctuation (a regex's " }" may need " " then "}")
        return (3, len(raw))
    c = text[:1]
    cls = 0 if c in b"}])>" else 1 if c in b"\"'" else 2 if c in b",:;" else 4 if c == b"0" else \
        5 if c.isdigit() else 6 if c.isalpha() else 7 if c.isspace() or c >= b"\x80" else 3
    return (cls, len(text))


class _Wrapped:
    """What llguidance's TokenizerWrapper reads: token bytes, special ids, a tokenize function.
    `byte_base`: for a word-level vocabulary, the id of the first of 256 one-byte tokens the model
    does not have (ids past its vocabulary, never allowed to it): llguidance tokenises any forced
    text, and a word-level vocabulary cannot spell a lone space or a word's prefix."""

    def __init__(self, tokenizer, tokens: list[bytes], special: list[int], eos: int, byte_base: int | None) -> None:
        self.eos_token_id, self.bos_token_id = eos, None
        self.tokens, self.special_token_ids = tokens, special
        self._tok, self._base = tokenizer, byte_base

    def __call__(self, s) -> list[int]:
        data = s.encode("utf-8") if isinstance(s, str) else bytes(s)
        if self._base is None:
            return self._tok.encode(data.decode("utf-8", errors="replace"), add_special_tokens=False).ids
        out: list[int] = []
        i = 0
        while i < len(data):  # " word" as the word's token where it is one, else byte by byte
            if data[i] == 32:
                j = data.find(b" ", i + 1)
                j = len(data) if j < 0 else j
                try:
                    t = self._tok.token_to_id(data[i + 1 : j].decode("utf-8")) if j > i + 1 else None
                except UnicodeDecodeError:
                    t = None
                if t is not None:
                    out.append(t)
                    i = j
                    continue
            out.append(self._base + data[i])
            i += 1
        return out


class GrammarVocab:
    """A model's vocabulary as llguidance sees it. `tokenizer`: unmask.tokenizer.Tokenizer;
    `stop_ids`: the ids that end the answer (allowed where the grammar accepts); `logits_width`:
    the model's vocabulary (its logits' last dimension, possibly padded past the tokenizer's)."""

    def __init__(self, tokenizer, stop_ids, logits_width: int) -> None:
        import llguidance

        self._llg = llguidance
        vb = vocab_bytes(tokenizer.tok)
        self.kind, self.space_joined = vb.kind, vb.space_joined
        tokens = [b if b and i not in vb.special else b"\xff" + (tokenizer.tok.id_to_token(i) or f"<{i}>").encode()
                  for i, b in enumerate(vb.tokens)]
        self.n_text = len(tokens)
        base = None
        if vb.space_joined:  # one-byte tokens past the model's vocabulary (see _Wrapped)
            base = len(tokens)
            tokens += [bytes([b]) for b in range(256)]
        self.stop = sorted(int(i) for i in stop_ids)
        special = sorted(set(vb.special) | set(self.stop))
        wrapped = llguidance.TokenizerWrapper(_Wrapped(tokenizer.tok, tokens, special, self.stop[0], base))
        self.ll = llguidance.LLTokenizer(wrapped, eos_token=self.stop)
        self.size = self.ll.vocab_size
        self.width = max(int(logits_width), self.n_text)
        self.words = (self.size + 31) // 32  # int32 words of one bitmask
        self.executor = llguidance.LLExecutor(num_threads=1)
        self._protos: OrderedDict = OrderedDict()  # (constraint, length) -> RowGrammar to copy (`row`)
        self._lock = threading.Lock()
        # the completion search's preference over text tokens (stops and specials never in it)
        keys = [(_rank_key(tokens[i]), i) for i in range(self.n_text) if i not in vb.special and i not in self.stop]
        self.order = np.array([i for _, i in sorted(keys)], dtype=np.int64)
        # the same classes, longest tokens first (fewer tokens: a long run of digits fits)
        self.order_long = np.array([i for _, i in sorted(keys, key=lambda k: (k[0][0], -k[0][1], k[1]))],
                                   dtype=np.int64)
        ranks = {i: k[0] for k, i in keys}
        self.classes = [np.array([i for i in self.order if ranks[i] == c], dtype=np.int64) for c in range(_CLASSES)]
        self.rank = np.full(len(tokens), _CLASSES, dtype=np.int64)
        self.rank[list(ranks)] = list(ranks.values())
        self.single = np.array([len(t.lstrip(b" ")) == 1 for t in tokens[: self.n_text]], dtype=bool)  # one char
        self.blank = np.array([i for i in self.order if not tokens[i].strip()], dtype=np.int64)  # spaces only
        self.json_options = ({"whitespace_flexible": True} if vb.space_joined
                             else {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "})

    def row(self, constraint: Constraint, length: int) -> "RowGrammar":
        """A fresh grammar state for a request (RowGrammar): the first for a (constraint,
        length) is compiled and planned, later ones are copies of it (a server sends the same
        schema again and again; compiling costs milliseconds, a copy microseconds). The last
        64 are kept."""
        key = (constraint, length)
        with self._lock:
            proto = self._protos.get(key)
            if proto is not None:
                self._protos.move_to_end(key)
        if proto is None:
            proto = RowGrammar(self, constraint, length)
            with self._lock:
                self._protos[key] = proto
                while len(self._protos) > 64:
                    self._protos.popitem(last=False)
        return proto.copy()

    def compile(self, constraint: Constraint) -> str:
        """The llguidance grammar of `constraint` for this vocabulary (checked: a grammar the
        library rejects raises UnmaskError with its message)."""
        sub = constraint.sub_grammar(self.json_options)
        if self.space_joined:  # the text the grammar reads starts with the space of the first word
            top = {"grammars": [{"lark_grammar": 'start: /[ \\x01]/ @answer'}, {"name": "answer", **sub}]}
        else:
            top = {"grammars": [sub]}
        grammar = json.dumps(top)
        failed, messages = self._llg.LLMatcher.validate_grammar_with_warnings(grammar, self.ll)
        if failed:
            raise UnmaskError(f"{constraint.kind} constraint rejected by the grammar engine: "
                              f"{_first_line(messages[0])}", param=constraint.kind)
        return grammar

    def matcher(self, grammar: str):
        m = self._llg.LLMatcher(self.ll, grammar, log_level=0)
        if m.is_error():
            raise UnmaskError(f"constraint rejected by the grammar engine: {_first_line(m.get_error())}")
        return m

    def allowed(self, matcher) -> np.ndarray:
        """(size,) bool: the tokens `matcher` allows next."""
        bits = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little")[: self.size].astype(bool)

    def complete(self, matcher, budget: int, tries: int = 2) -> list[int] | None:
        """A token sequence of at most `budget` tokens after which `matcher` accepts, or None
        (`matcher` is not changed). The greedy search of the module docstring: a token after
        which the grammar accepts (or after one more token), else closing tokens first, then
        punctuation, digits, letters and whitespace, a token used twice already in this completion
        after the others; when it fails, a second run prefers the longest token of each class (a
        long run of digits fits in fewer tokens), then more runs draw each token from the 16
        preferred ones or from all allowed (seeded: the same answer every time)."""
        for attempt in range(tries):
            order = self.order_long if attempt == 1 else self.order
            out = self._greedy(matcher, budget, None if attempt < 2 else np.random.default_rng(attempt), order)
            if out is not None:
                return out
        return None

    def _greedy(self, matcher, budget: int, rng, order: np.ndarray) -> list[int] | None:
        m, out, used, last = matcher.deep_copy(), [], {}, -1
        while True:
            if m.is_accepting():
                return out
            if len(out) >= budget or m.is_error() or m.is_stopped():
                return None
            ff = m.compute_ff_tokens()
            nxt = ff[0] if ff and ff[0] < self.n_text else None
            if nxt is None:
                ok = self.allowed(m)
                pick = order[ok[order]][:64].tolist()
                if not pick:
                    return None
                # the candidates looked ahead from: the 8 preferred, each class's first, and whitespace
                # (" }" may be " " then "}"; a line ends with "\n", the last class)
                spaces = self.blank[ok[self.blank]].tolist()
                firsts = [int(c[ok[c]][0]) for c in self.classes if ok[c].any()]
                ahead = list(dict.fromkeys(pick[:8] + firsts + spaces[:2] + [t for t in spaces if self.single[t]]))
                nxt = next((t for t in ahead if self._ends(m, t)), None)  # one that ends it now
                if nxt is None:  # one after which a token ends it
                    nxt = next((t for t in ahead if self._ends_after(m, t)), None)
                if nxt is None and rng is not None:  # a random draw: of the preferred ones, or of any allowed
                    pool = pick[:16] if rng.random() < 0.5 else order[ok[order]]
                    nxt = int(rng.choice(pool))
                if nxt is None:  # loops end: a digit, letter or other text token used twice, or one
                    # more after one of its class, goes after the others, and so does punctuation of
                    # a class written three times in a row already ("))>" in a string: then a quote)
                    def penalty(t: int) -> tuple:
                        if self.rank[t] >= 4:
                            return (used.get(t, 0) // 2, self.rank[t] == last)
                        return (int(len(out) >= 3 and all(self.rank[u] == self.rank[t] for u in out[-3:])), False)

                    nxt = min(pick, key=penalty)
            used[nxt] = used.get(nxt, 0) + 1
            last = int(self.rank[nxt])
            if not m.consume_token(nxt):
                return None
            out.append(nxt)

    @staticmethod
    def _ends(m, t: int) -> bool:
        """Would token `t` leave `m` accepting? (`m` unchanged)"""
        if m.try_consume_tokens([t]) != 1:
            return False
        ends = m.is_accepting()
        m.rollback(1)
        return ends

    def _ends_after(self, m, t: int) -> bool:
        """Would token `t` and then one of the 8 preferred next tokens leave `m` accepting?"""
        if m.try_consume_tokens([t]) != 1:
            return False
        ok = self.allowed(m)
        ends = any(self._ends(m, int(u)) for u in self.order[ok[self.order]][:8])
        m.rollback(1)
        return ends

    def bitmask(self, n: int) -> torch.Tensor:
        return torch.zeros(n, self.words, dtype=torch.int32)

    def fill(self, matchers: list, bitmask: torch.Tensor) -> None:
        """Each matcher's mask of allowed next tokens into bitmask row k (one parallel call)."""
        self.executor.unsafe_compute_mask_ptr([(m, k) for k, m in enumerate(matchers)], bitmask.data_ptr(),
                                              self.words * 4, bitmask.shape[0])

    def unpack(self, bitmask: torch.Tensor, width: int) -> torch.Tensor:
        """(n, words) int32 bitmask -> (n, width) bool over the model's logits (text tokens only)."""
        bits = torch.arange(32, dtype=torch.int32, device=bitmask.device)
        out = ((bitmask[:, :, None] >> bits) & 1).bool().flatten(1)
        keep = torch.zeros(bitmask.shape[0], width, dtype=torch.bool, device=bitmask.device)
        n = min(width, self.n_text, out.shape[1])
        keep[:, :n] = out[:, :n]
        return keep


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else "unknown error"
