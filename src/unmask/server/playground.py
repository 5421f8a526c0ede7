"""The playground: a page (GET /) and its per-step event stream (POST /playground/stream): after
every step, the whole answer canvas with each position's state (masked, proposed this step,
committed; for a renoising model's running canvas, its argmax with stable, accepted or renoised),
the step count, NFE and tokens per forward; then the final text. Not an OpenAI endpoint."""

import uuid
from pathlib import Path

from fastapi.responses import HTMLResponse, StreamingResponse

from unmask import holes as holes_
from unmask.llm import LLM
from unmask.params import GenerationParams
from unmask.server.async_engine import AsyncEngine, QueueFull
from unmask.server.openai import APIError, sse
from unmask.server.text import TextStream

PAGE = Path(__file__).parent / "playground.html"


def page(kind: str = "masked", hole: bool = False) -> HTMLResponse:
    """The page, told the kind of model served ("masked", "renoising" or "autoregressive"): only a
    masked model's form sends a policy, a cache and a block length; only a model that sees text
    after a hole (`hole`) shows the field for it."""
    return HTMLResponse(PAGE.read_text(encoding="utf-8").replace(
        '<body data-kind="masked">', f'<body data-kind="{kind}" data-hole="{int(hole)}">', 1))


def stream(engine: AsyncEngine, llm: LLM, ids: list[int], params: GenerationParams, stops: list[str],
           holes: dict | None = None):
    """`holes`: a hole's text after it (`suffix`), as the engine takes it: the canvas is then the
    hole, and the final text its middle."""
    rid = f"play-{uuid.uuid4().hex[:24]}"
    holes = holes or {}
    try:
        queue = engine.submit(rid, ids, params, watch=True, **holes)
    except QueueFull as e:
        raise APIError(429, str(e), "rate_limit_error") from None
    text = TextStream(llm, stops, suffix=holes.get("suffix") if holes_.ends_at_suffix(params) else None)
    stop_ids, mask = set(llm.token_ids.stop), llm.token_ids.mask

    def piece(t: int) -> str:  # end of text shows as one mark, not its long special-token name
        return "∎" if t in stop_ids else llm.tokenizer.decode([t], skip_special_tokens=False)

    def cells(canvas: list[int], proposal: dict[int, int]) -> list[dict]:
        return [{"state": "committed", "text": piece(t)} if t != mask else
                {"state": "proposed", "text": piece(proposal[j])} if j in proposal else
                {"state": "masked", "text": ""} for j, t in enumerate(canvas)]

    async def events():
        done, step, committed_total, forwards = False, 0, 0, 0
        try:
            while True:
                item = await queue.get()
                if item is None or isinstance(item, BaseException):
                    break
                # this step's own counts (the request's running totals may be ahead of the queue)
                step, committed_total, forwards = step + 1, committed_total + item.tokens, forwards + item.forwards
                text.add(item.new_ids)
                shown = (cells(item.canvas or [], item.proposal or {}) if item.states is None else
                         [{"state": st, "text": piece(t)} for t, st in zip(item.canvas, item.states)])
                yield sse({"type": "step", "step": step, "nfe": forwards,
                           "cells": shown, "committed": item.committed,
                           "tokens_per_forward": committed_total / step, "text": text.text})
                if item.finished or text.finish_reason is not None:
                    done = True
                    break
            text.flush()
            yield sse({"type": "done", "text": text.text, "nfe": step, "finish_reason": text.finish_reason or "length"})
        finally:
            if not done:
                engine.abort(rid)

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
