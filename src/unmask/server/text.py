"""Committed token ids -> text that is safe to stream: the masked models' committed-prefix stream."""

from unmask.llm import LLM


class TextStream:
    """Cut at the first end-of-text id and at the first stop string; a possibly incomplete
    character or stop string is held back (up to the longest stop string's length minus one
    characters), so text once sent is never retracted."""

    def __init__(self, llm: LLM, stops: list[str]) -> None:
        self.llm, self.stops = llm, stops
        self.stop_ids = set(llm.token_ids.stop)
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.ids: list[int] = []
        self.text = ""
        self.sent = 0
        self.finish_reason: str | None = None

    def add(self, new_ids: list[int]) -> str:
        if self.finish_reason is not None:
            return ""
        for t in new_ids:
            if t in self.stop_ids:
                self.finish_reason = "stop"
                break
            self.ids.append(t)
        self.text = self.llm.tokenizer.decode(self.ids)
        hits = [self.text.find(s) for s in self.stops if s in self.text]
        if hits:
            self.text = self.text[: min(hits)]
            self.finish_reason = "stop"
        end = len(self.text) if self.finish_reason else len(self.text) - self.hold
        while end > self.sent and self.text[end - 1] == "\ufffd":  # an incomplete multi-byte character
            end -= 1
        delta = self.text[self.sent : max(end, self.sent)]
        self.sent += len(delta)
        return delta

    def flush(self) -> str:
        delta = self.text[self.sent :]
        self.sent = len(self.text)
        return delta
