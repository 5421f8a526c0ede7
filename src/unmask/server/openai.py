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
    out = {"prompt_tokens": prompt_len, "completion_tokens": n, "total_tokens": prompt_len + n,
           "nfe": nfe, "tokens_per_forward": (n + ends) / nfe if nfe else 0.0,
           "edits": _sum(done, "edits"), "remasked": _sum(done, "remasked")}
    if _sum(done, "draft_forwards"):  # speculative decoding: the drafter's side
        out |= {"draft_forwards": _sum(done, "draft_forwards"), "draft_tokens": _sum(done, "drafted"),
                "accepted_draft_tokens": _sum(done, "accepted")}
    return out


def chunk(kind: str, rid: str, created: int, model: str, i: int, delta: str | None, finish: str | None,
          first: bool = False) -> dict:
    """One streamed choice update: a chat.completion.chunk or a text_completion chunk."""
    if kind == "chat":
        d = {"content": delta} if delta is not None else {}
        if first:
            d = {"role": "assistant", **d}
        return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": i, "delta": d, "finish_reason": finish}]}
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": i, "text": delta or "", "logprobs": None, "finish_reason": finish}]}


def usage_chunk(kind: str, rid: str, created: int, model: str, use: dict) -> dict:
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": use}


def response(kind: str, rid: str, created: int, model: str, texts: list[str], reasons: list[str], use: dict) -> dict:
    """The whole (non-streamed) response with one choice per text."""
    if kind == "chat":
        choices = [{"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": r}
                   for i, (t, r) in enumerate(zip(texts, reasons))]
        return {"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": choices,
                "usage": use}
    choices = [{"index": i, "text": t, "logprobs": None, "finish_reason": r} for i, (t, r) in enumerate(zip(texts, reasons))]
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": choices,
            "usage": use}
