"""Committed token ids -> text that is safe to stream: the masked models' committed-prefix stream,
and the logprob entries of the tokens whose text has gone out."""

from unmask.holes import Template, cut_hole
from unmask.llm import LLM
from unmask.sampler.stops import suffix_overlap


class TextStream:
    """Cut at the first end-of-text id and at the first stop string; a possibly incomplete
    character or stop string is held back (up to the longest stop string's length minus one
    characters), so text once sent is never retracted. With `suffix` (a hole whose length is
    bounded) also cut where the middle goes on with the suffix's own text, the tokens that may
    begin to held back until it is known (sampler.stops.suffix_overlap)."""

    def __init__(self, llm: LLM, stops: list[str], template: Template | None = None,
                 suffix: list[int] | None = None, bounded: bool = False) -> None:
        """`suffix`: a single hole's, its length bounded; `bounded`: a template's holes' lengths
        are bounds."""
        self.llm, self.stops, self.suffix, self.bounded = llm, stops, suffix or [], bounded
        self.stop_ids = set(llm.token_ids.stop)
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.ids: list[int] = []  # the generated ids (a template's: its holes' ids)
        self.text = ""
        self.sent = 0
        self.finish_reason: str | None = None
        # a template's region streams as its committed prefix grows: fixed text as written, each
        # hole up to its end of text (the rest of that hole skipped); it never stops early
        self.template, self.raw = template, []
        self.holes: list[list[int]] = [] if template is None else [[] for _ in template.holes]
        self._ended: set[int] = set()
        # logprobs: each generated id's (logprob, [(id, logprob)] of the most likely), the text's
        # length through each id, and how many entries went out
        self.scores: list = []
        self.token_ends: list[int] = []
        self.given = 0
        self.cut = False  # a stop string cut the text

    @property
    def ends(self) -> int:
        """End-of-text tokens committed (counted in tokens per forward): one per hole of a template."""
        return len(self._ended) if self.template is not None else int(self.finish_reason == "stop")

    def add(self, new_ids: list[int], logprobs: list | None = None) -> str:
        """The new ids' text that can go out now; `logprobs`: their entries (one per id)."""
        if self.finish_reason is not None:
            return ""
        if self.template is not None:
            return self._add_region(new_ids)
        for k, t in enumerate(new_ids):
            if t in self.stop_ids:
                self.finish_reason = "stop"
                break
            self.ids.append(t)
            if logprobs is not None:
                self.scores.append(logprobs[k])
                self.token_ends.append(len(self.llm.tokenizer.decode(self.ids)))
        safe = len(self.ids)
        if self.suffix:
            at, safe = suffix_overlap(self.ids, self.suffix)
            if at is not None:
                del self.ids[at:], self.scores[at:], self.token_ends[at:]
                self.finish_reason = "stop"
        self.text = self.llm.tokenizer.decode(self.ids)
        held = 0 if self.finish_reason or safe >= len(self.ids) else len(self.text) - len(
            self.llm.tokenizer.decode(self.ids[:safe]))
        hits = [self.text.find(s) for s in self.stops if s in self.text]
        if hits:
            self.text = self.text[: min(hits)]
            self.finish_reason, self.cut = "stop", True
        end = len(self.text) if self.finish_reason else len(self.text) - max(self.hold, held)
        while end > self.sent and self.text[end - 1] == "\ufffd":  # an incomplete multi-byte character
            end -= 1
        delta = self.text[self.sent : max(end, self.sent)]
        self.sent += len(delta)
        return delta

    def _add_region(self, new_ids: list[int]) -> str:
        """The region's committed prefix: fixed text as written, each hole cut as holes.cut_hole
        cuts it; in the hole still being written, ids that may yet begin the text after it are
        held back (the stream stops there until they are known)."""
        t, stops = self.template, self.stop_ids
        self.raw += new_ids
        shown, at, held = [], 0, None
        for h, (s, e) in enumerate(t.holes):
            shown += self.raw[at : min(s, len(self.raw))]
            if len(self.raw) <= s:
                break
            ids, ended, safe = cut_hole(t, h, self.raw[s:e], stops, self.bounded)
            self.holes[h] = ids
            if ended:
                self._ended.add(h)
            shown += ids
            if len(self.raw) < e and not ended:
                held = len(shown) - len(ids) + safe  # shown ids known for certain
                break
            at = e
        else:
            shown += self.raw[at:]
        self.ids = sum(self.holes, [])
        self.text = self.llm.tokenizer.decode(shown)
        end = len(self.text) if held is None else len(self.llm.tokenizer.decode(shown[:held]))
        while end > self.sent and self.text[end - 1] == "\ufffd":  # an incomplete multi-byte character
            end -= 1
        delta = self.text[self.sent : max(end, self.sent)]
        self.sent += len(delta)
        return delta

    def hole_texts(self) -> list[str]:
        return [self.llm.tokenizer.decode(h) for h in self.holes]

    def flush(self) -> str:
        delta = self.text[self.sent :]
        self.sent = len(self.text)
        return delta

    def take(self) -> list[tuple[str, float, list[tuple[int, float]]]]:
        """The logprob entries not given yet of the tokens whose text has gone out in full (after
        `flush`, every token that wrote any of the answer): (its text, its logprob, the most
        likely tokens' texts with theirs). A token's text is its slice of the answer, so the entries'
        texts join to the answer (a stop string cuts the last one; tokens after it have none)."""
        out = []
        while self.given < len(self.scores):
            i = self.given
            start = self.token_ends[i - 1] if i else 0
            if self.cut and start >= len(self.text):  # after the stop string
                self.given = len(self.scores)
                break
            end = min(self.token_ends[i], len(self.text))
            if end > self.sent:
                break
            lp, top = self.scores[i]
            out.append((self.text[start:end], lp, [(self._name(i, t), v) for t, v in top]))
            self.given += 1
        return out

    def _name(self, i: int, token: int) -> str:
        """Token's text in place of the i-th id: after the id before it, as the answer's own
        tokens are named (a word-level or SentencePiece token's space is the context's)."""
        if not i:
            return self.llm.tokenizer.decode([token])
        before = self.ids[i - 1]
        return self.llm.tokenizer.decode([before, token])[len(self.llm.tokenizer.decode([before])):]
