"""OpenAI's shapes: errors, server-sent events, usage, completion and chat responses and chunks."""

import json

from fastapi.responses import JSONResponse


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param


def error_response(status: int, message: str, type_: str = "invalid_request_error",
                   param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": status}},
                        status_code=status)


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def _sum(reqs: list, counter: str) -> int:
    """A row kind's counter summed over the requests (0 where their kind does not count it)."""
    return sum(r.counters().get(counter, 0) for r in reqs)


def usage(reqs: list, streams: list, prompt_len: int) -> dict:
    """OpenAI's usage (the prompt counted once, completions summed over choices) plus the
    requests' forwards (NFE), tokens per forward (end of text included), and the committed tokens
    their policies edited or masked again."""
    n = sum(len(st.ids) for st in streams)
    nfe = sum(r.nfe for r in reqs if r is not None)
    ends = sum(st.ends for st in streams)
    done = [r for r in reqs if r is not None]
    # prompt tokens whose K/V came from the prefix cache, as OpenAI reports cached tokens (the
    # prompt is counted once: the tokens every choice reused)
    cached = min((r.cached_tokens for r in done), default=0)
    out = {"prompt_tokens": prompt_len, "completion_tokens": n, "total_tokens": prompt_len + n,
           "prompt_tokens_details": {"cached_tokens": cached}, "nfe": nfe, "tokens_per_forward": (n + ends) / nfe if nfe else 0.0,
           "edits": _sum(done, "edits"), "remasked": _sum(done, "remasked")}
    if _sum(done, "draft_forwards"):  # speculative decoding: the drafter's side
        out |= {"draft_forwards": _sum(done, "draft_forwards"), "draft_tokens": _sum(done, "drafted"),
                "accepted_draft_tokens": _sum(done, "accepted")}
    return out


def logprobs(kind: str, entries: list | None, offset: int = 0) -> dict | None:
    """A choice's (or a chunk's) logprobs in OpenAI's shape from text stream entries (text,
    logprob, [(text, logprob)] of the most likely; server/text.py TextStream.take); `offset`:
    the first entry's character offset in the answer (completions' text_offset). None without
    logprobs."""
    if entries is None:
        return None
    if kind == "chat":
        def one(text, lp):
            return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}
        return {"content": [{**one(t, lp), "top_logprobs": [one(n, v) for n, v in top]} for t, lp, top in entries],
                "refusal": None}
    offsets = []
    for t, _, _ in entries:
        offsets.append(offset)
        offset += len(t)
    return {"tokens": [t for t, _, _ in entries], "token_logprobs": [lp for _, lp, _ in entries],
            # OpenAI's legacy shape: the most likely tokens and the chosen one, by text
            "top_logprobs": [{**dict(top), t: lp} for t, lp, top in entries],
            "text_offset": offsets}


def tool_call(call_id: str, name: str, arguments: str) -> dict:
    """One tool call of an assistant message (OpenAI's shape: the arguments as JSON text)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_delta(call_id: str | None, name: str | None, arguments: str) -> dict:
    """A streamed piece of the one tool call a chat choice makes: its first carries the call's
    id, type and name; every piece the next characters of its arguments."""
    piece: dict = {"index": 0, "function": {"arguments": arguments}}
    if call_id is not None:
        piece = {"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"tool_calls": [piece]}


def chunk(kind: str, rid: str, created: int, model: str, i: int, delta: str | dict | None, finish: str | None,
          first: bool = False, lps: dict | None = None) -> dict:
    """One streamed choice update: a chat.completion.chunk or a text_completion chunk (`delta`:
    text, or a chat delta's fields such as `tool_delta`'s; `lps`: the logprobs of the tokens it
    carries, `logprobs`' shape)."""
    if kind == "chat":
        d = delta if isinstance(delta, dict) else {"content": delta} if delta is not None else {}
        if first:
            d = {"role": "assistant", **d}
        return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": i, "delta": d, "logprobs": lps, "finish_reason": finish}]}
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": i, "text": delta or "", "logprobs": lps, "finish_reason": finish}]}


def usage_chunk(kind: str, rid: str, created: int, model: str, use: dict) -> dict:
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": use}


def response(kind: str, rid: str, created: int, model: str, texts: list[str], reasons: list[str], use: dict,
             lps: list | None = None, calls: list | None = None) -> dict:
    """The whole (non-streamed) response with one choice per text (`lps`: each choice's logprobs;
    `calls`: each chat choice's tool call (`tool_call`), its message's content then null)."""
    lps = lps or [None] * len(texts)
    if kind == "chat":
        calls = calls or [None] * len(texts)
        msg = lambda t, c: ({"role": "assistant", "content": t} if c is None  # noqa: E731
                            else {"role": "assistant", "content": None, "tool_calls": [c]})
        choices = [{"index": i, "message": msg(t, c), "logprobs": lp, "finish_reason": r}
                   for i, (t, r, lp, c) in enumerate(zip(texts, reasons, lps, calls))]
        return {"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": choices,
                "usage": use}
    choices = [{"index": i, "text": t, "logprobs": lp, "finish_reason": r}
               for i, (t, r, lp) in enumerate(zip(texts, reasons, lps))]
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": choices,
            "usage": use}
