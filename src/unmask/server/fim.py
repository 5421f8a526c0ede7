"""The infill endpoints editors and gateways call: Mistral's and Inception's `/v1/fim/completions`
(answered as a chat completion, as they answer it) and llama.cpp's `/infill` (llama.vim,
llama.vscode). Both are a completion with text after the hole (`requests.infill`): the same
middle as `/v1/completions` with `suffix`, streamed or whole."""

import time

from unmask.server import openai
from unmask.server.completion import Completion
from unmask.server.openai import APIError


def cut_at_indent(text: str, n_indent: int) -> tuple[str, bool]:
    """llama.cpp's `n_indent`: the answer ends before the first later line indented by fewer than
    `n_indent` whitespace characters (a line of only whitespace does not end it). Returns the kept
    text and whether it was cut."""
    if n_indent <= 0:
        return text, False
    lines = text.split("\n")
    for k, line in enumerate(lines[1:], start=1):
        body = line.lstrip(" \t")
        if body and len(line) - len(body) < n_indent:
            return "\n".join(lines[:k]) + "\n", True
    return text, False


def project(obj: dict, fields: list[str] | None) -> dict:
    """llama.cpp's `response_fields`: only those fields, a nested one named by its path ("a/b"),
    under that name; a path that is not there is left out."""
    if fields is None:
        return obj
    out = {}
    for path in fields:
        value, ok = obj, True
        for key in path.split("/"):
            if isinstance(value, dict) and key in value:
                value = value[key]
            else:
                ok = False
                break
        if ok and path:
            out[path] = value
    return out


class LlamaInfill(Completion):
    """One `/infill` request in llama.cpp's shape: `content`, `stop`, `stop_type`, `tokens_predicted`,
    `tokens_evaluated`, `tokens_cached`, `truncated`, `timings`, ...; streamed as `data:` events
    of `content` pieces and a last one with `stop: true` and the rest; several completions
    (`n_cmpl`) as a list, or in the stream each event with its `index`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.t0 = time.perf_counter()
        self.first = [None] * self.n  # when each completion's first text went out
        self.sent = [""] * self.n  # each completion's text so far (n_indent is checked on it)

    def _result(self, i: int, text: str, indent_cut: bool) -> dict:
        req, st = self.reqs[i], self.streams[i]
        now = time.perf_counter()
        first = self.first[i] or now
        prompt_ms, predicted_ms = (first - self.t0) * 1000, (now - first) * 1000
        n = len(st.ids)
        reason = "limit" if self.reason(i) == "length" and not indent_cut else "word" if st.cut else "eos"
        return {"index": i, "content": text, "id_slot": 0, "stop": True, "model": self.model,
                "tokens_predicted": n, "tokens_evaluated": self.prompt_tokens,
                "tokens_cached": 0 if req is None else req.cached_tokens, "truncated": False,
                "stop_type": reason, "stopping_word": "", "has_new_line": "\n" in text,
                "nfe": 0 if req is None else req.nfe,
                "timings": {"prompt_n": self.prompt_tokens, "prompt_ms": prompt_ms,
                            "prompt_per_token_ms": prompt_ms / max(self.prompt_tokens, 1),
                            "prompt_per_second": self.prompt_tokens / (prompt_ms / 1000) if prompt_ms else 0.0,
                            "predicted_n": n, "predicted_ms": predicted_ms,
                            "predicted_per_token_ms": predicted_ms / n if n else 0.0,
                            "predicted_per_second": n / (predicted_ms / 1000) if predicted_ms else 0.0}}

    async def whole(self):
        try:
            async for i, out in self.updates():
                self.step(i, out)
                if self.first[i] is None and self.streams[i].ids:
                    self.first[i] = time.perf_counter()
        finally:
            self.cleanup()
        if not all(self.done):
            raise APIError(499, "client closed the request")
        results = []
        for i, st in enumerate(self.streams):
            st.flush()
            text, cut = cut_at_indent(st.text, self.body.n_indent)
            results.append(project(self._result(i, text, cut), self.body.response_fields))
        return results[0] if self.n == 1 else results

    def streamed(self):  # its own shape and framing
        return self.events()

    async def events(self):
        ended = [False] * self.n
        try:
            async for i, out in self.updates():
                if ended[i]:
                    continue
                delta = self.step(i, out)
                if self.done[i]:
                    delta += self.streams[i].flush()
                if delta and self.first[i] is None:
                    self.first[i] = time.perf_counter()
                whole, cut = cut_at_indent(self.sent[i] + delta, self.body.n_indent)
                piece = whole[len(self.sent[i]):]
                self.sent[i] = whole
                if piece:
                    yield openai.sse(project({"index": i, "content": piece, "stop": False}, self.body.response_fields))
                if cut:  # the indentation ended it (updates() then aborts its request)
                    self.done[i] = True
                if self.done[i]:
                    ended[i] = True
                    yield openai.sse(project({**self._result(i, "", cut)}, self.body.response_fields))
        except Exception as e:  # an error after the stream started: an error event, then close
            yield openai.sse({"error": {"message": f"{type(e).__name__}: {e}", "type": "server_error", "code": 500}})
        finally:
            self.cleanup()


def empty_infill(body, model: str) -> dict | list:
    """`n_predict` 0 (an editor sending context ahead of a request): nothing generated."""
    one = {"index": 0, "content": "", "id_slot": 0, "stop": True, "model": model, "tokens_predicted": 0,
           "tokens_evaluated": 0, "tokens_cached": 0, "truncated": False, "stop_type": "limit", "stopping_word": "",
           "has_new_line": False, "timings": {"prompt_n": 0, "prompt_ms": 0.0, "predicted_n": 0, "predicted_ms": 0.0}}
    out = [project({**one, "index": i}, body.response_fields) for i in range(body.n)]
    return out[0] if body.n == 1 else out
