"""`unmask serve`: an OpenAI-compatible HTTP server over the request-level engine.

Endpoints: GET /health, GET /v1/models, POST /v1/completions, POST /v1/chat/completions,
GET /metrics (Prometheus text), and the playground: GET / (a page) with its per-step event stream
POST /playground/stream. Requests are batched continuously by the engine. A stream sends
only the committed left prefix of the answer: text is never retracted, a chunk goes out as soon
as the contiguous committed prefix grows, a stop string is honoured across chunk boundaries (up
to its length minus one characters are held back), and the last chunk carries finish_reason
(and usage with stream_options.include_usage). Errors use OpenAI's shape: 400 for bad
parameters or malformed JSON, 401 without the API key, 404 for another model name, 429 when the
queue is full; an error after a stream started is sent as an error event before the stream
closes. A client that disconnects aborts its request.

Prompt text that contains the literal text of one of the tokenizer's special tokens (the mask,
end of text, chat markers) is refused with a 400 that names it: it would otherwise be read as
that token, not as text. Token-id prompts may use any id but the mask.
"""

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from unmask.engine.engine import EngineConfig
from unmask.errors import UnmaskError
from unmask.llm import LLM
from unmask.params import GenerationParams, resolve_params
from unmask.server.async_engine import AsyncEngine, QueueFull
from unmask.server.protocol import ChatRequest, CompletionRequest


PLAYGROUND = Path(__file__).parent / "playground.html"


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param


def _error(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": status}},
                        status_code=status)


class TextStream:
    """Committed token ids -> text that is safe to send: cut at the first end-of-text id and at
    the first stop string; a possibly incomplete character or stop string is held back."""

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


def build_app(llm: LLM, served_model_name: str = "unmask", api_key: str | None = None,
              engine_config: EngineConfig | None = None) -> FastAPI:
    state: dict = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state["engine"] = app.state.engine = AsyncEngine(llm.engine(engine_config))
        try:
            yield
        finally:
            state["engine"].close()

    app = FastAPI(title="unmask", lifespan=lifespan)
    app.state.llm, app.state.model_name = llm, served_model_name
    specials = _special_strings(llm)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return _error(e.status, e.message, e.type, e.param)

    @app.exception_handler(UnmaskError)
    async def _unmask_error(request: Request, e: UnmaskError):
        return _error(400, str(e))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        return _error(400, f"{where}: {first.get('msg', 'invalid request')}" if where else first.get("msg", "invalid"),
                      param=where or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException):
        return _error(e.status_code, str(e.detail), "not_found_error" if e.status_code == 404 else "invalid_request_error")

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        if api_key is not None and request.url.path.startswith(("/v1/", "/playground/")):
            if request.headers.get("authorization") != f"Bearer {api_key}":
                return _error(401, "missing or wrong API key (Authorization: Bearer ...)", "authentication_error")
        return await call_next(request)

    @app.get("/health")
    async def health():
        engine: AsyncEngine = state["engine"]
        if engine.error is not None:
            return _error(503, f"the engine stopped: {engine.error}", "server_error")
        return {"status": "ok", "running": engine.num_running, "waiting": engine.num_waiting}

    @app.get("/", response_class=HTMLResponse)
    async def playground():
        return HTMLResponse(PLAYGROUND.read_text(encoding="utf-8"))

    @app.post("/playground/stream")
    async def playground_stream(body: CompletionRequest, request: Request):
        """The playground's opt-in event stream: after every step, the whole answer canvas with
        each position's state (masked, proposed this step, committed), the step count, NFE and
        tokens per forward; then the final text. Not an OpenAI endpoint."""
        prompt = body.prompt_value()
        if not isinstance(prompt, str):
            raise APIError(400, "the playground takes a text prompt", param="prompt")
        _check_text(prompt, specials, "prompt")
        ids = _encode(llm, prompt, chat=False)
        params = _params(llm, body, ids)
        engine: AsyncEngine = state["engine"]
        rid = f"play-{uuid.uuid4().hex[:24]}"
        try:
            queue = engine.submit(rid, ids, params, watch=True)
        except QueueFull as e:
            raise APIError(429, str(e), "rate_limit_error") from None
        stream = TextStream(llm, body.stops())
        stop_ids = set(llm.token_ids.stop)

        def piece(t: int) -> str:  # end of text shows as one mark, not its long special-token name
            return "∎" if t in stop_ids else llm.tokenizer.decode([t], skip_special_tokens=False)

        async def events():
            done, step, committed_total = False, 0, 0
            try:
                while True:
                    item = await queue.get()
                    if item is None or isinstance(item, BaseException):
                        break
                    step += 1
                    committed_total += item.request.commits[-1] if item.request.commits else 0
                    stream.add(item.new_ids)
                    proposal = item.request.proposal
                    cells = []
                    for j, t in enumerate(item.canvas or []):
                        if t != llm.token_ids.mask:
                            cells.append({"state": "committed", "text": piece(t)})
                        elif j in proposal:
                            cells.append({"state": "proposed", "text": piece(proposal[j])})
                        else:
                            cells.append({"state": "masked", "text": ""})
                    yield _sse({"type": "step", "step": step, "nfe": item.request.nfe, "cells": cells,
                                "committed": item.committed, "tokens_per_forward": committed_total / step,
                                "text": stream.text})
                    if item.finished or stream.finish_reason is not None:
                        done = True
                        break
                stream.flush()
                yield _sse({"type": "done", "text": stream.text, "nfe": step,
                            "finish_reason": stream.finish_reason or "length"})
            finally:
                if not done:
                    engine.abort(rid)

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served_model_name, "object": "model", "created": 0,
                                            "owned_by": "unmask", "max_model_len": llm.arch.max_positions}]}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(_prometheus(state["engine"]), media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        _check_model(body.model, served_model_name)
        prompt = body.prompt_value()
        if isinstance(prompt, str):
            _check_text(prompt, specials, "prompt")
            ids = _encode(llm, prompt, chat=False)
        else:
            ids = list(prompt)
        return await _serve(state["engine"], llm, body, ids, request, "completion", served_model_name)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        _check_model(body.model, served_model_name)
        for i, m in enumerate(body.messages):
            _check_text(m.content, specials, f"messages.{i}.content")
        messages = [{"role": m.role, "content": m.content} for m in body.messages]
        if llm.tokenizer.chat_template is not None:
            try:
                text = llm.tokenizer.apply_chat_template(messages)
            except UnmaskError as e:
                raise APIError(400, str(e)) from None
            ids = llm.tokenizer.encode(text, add_special_tokens=False)
        else:  # no chat template (the embedded models): the last user message is the prompt
            users = [m["content"] for m in messages if m["role"] == "user"]
            if not users:
                raise APIError(400, "messages need a user message", param="messages")
            ids = _encode(llm, users[-1], chat=False)
        return await _serve(state["engine"], llm, body, ids, request, "chat", served_model_name)

    return app


def _special_strings(llm: LLM) -> list[str]:
    decoder = llm.tokenizer.tok.get_added_tokens_decoder()
    return sorted({t.content for t in decoder.values() if t.special}, key=len, reverse=True)


def _check_text(text: str, specials: list[str], where: str) -> None:
    hit = next((s for s in specials if s in text), None)
    if hit is not None:
        raise APIError(400, f"{where} contains the special token text {hit!r}; it would be read as that token, "
                            "not as text (send token ids to use special tokens)", param=where)


def _check_model(name: str | None, served: str) -> None:
    if name is not None and name != served:
        raise APIError(404, f"model {name!r} does not exist; this server serves {served!r}", "not_found_error", "model")


def _encode(llm: LLM, text: str, chat: bool) -> list[int]:
    try:
        return llm.encode([text], chat=chat)[0]
    except UnmaskError as e:
        raise APIError(400, str(e), param="prompt") from None


AR_FIELDS = ("gen_length", "temperature", "seed", "early_stop")


def _params(llm: LLM, body, ids: list[int]) -> GenerationParams:
    fields = body.generation_fields()
    if llm.arch.causal:  # an autoregressive model takes the length and sampling settings only
        ignored = sorted(k for k, v in fields.items() if v is not None and k not in AR_FIELDS)
        if ignored:
            raise APIError(400, f"{', '.join(ignored)}: not used by an autoregressive model (it decodes one token "
                                "per forward with its KV cache)", param=ignored[0])
    try:
        params = resolve_params(fields, llm.generation_defaults, fast=not llm.arch.causal,
                                block_size=llm.arch.block_size)
        llm._check_prompts([ids], params)
        body.stops()
    except UnmaskError as e:
        raise APIError(400, str(e)) from None
    return params


def _usage(reqs: list, streams: list[TextStream], prompt_len: int) -> dict:
    """OpenAI's usage (the prompt counted once, completions summed over choices) plus the
    requests' forwards (NFE) and tokens per forward, end of text included."""
    n = sum(len(st.ids) for st in streams)
    nfe = sum(r.nfe for r in reqs if r is not None)
    ends = sum(st.finish_reason == "stop" for st in streams)
    return {"prompt_tokens": prompt_len, "completion_tokens": n, "total_tokens": prompt_len + n,
            "nfe": nfe, "tokens_per_forward": (n + ends) / nfe if nfe else 0.0}


async def _serve(engine: AsyncEngine, llm: LLM, body, ids: list[int], request: Request, kind: str, model: str):
    """One request with `n` choices: n engine requests (choice i samples with seed + i when a seed
    is given), streamed together with their choice index or returned together."""
    params = _params(llm, body, ids)
    rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    n = body.n
    names = [rid] if n == 1 else [f"{rid}-{i}" for i in range(n)]
    queues = []
    try:
        for i, name in enumerate(names):
            seed = None if params.seed is None else params.seed + i
            queues.append(engine.submit(name, ids, replace(params, seed=seed)))
    except (QueueFull, UnmaskError) as e:
        for name in names[: len(queues)]:
            engine.abort(name)
        if isinstance(e, QueueFull):
            raise APIError(429, str(e), "rate_limit_error") from None
        raise APIError(503, str(e), "server_error") from None
    streams = [TextStream(llm, body.stops()) for _ in range(n)]
    reqs: list = [None] * n
    done = [False] * n
    created = int(time.time())
    merged: asyncio.Queue = asyncio.Queue()

    async def forward(i: int, q: asyncio.Queue) -> None:
        while True:
            item = await q.get()
            await merged.put((i, item))
            if item is None or isinstance(item, BaseException):
                return

    forwarders = [asyncio.create_task(forward(i, q)) for i, q in enumerate(queues)]

    def chunk(i: int, delta: str | None, finish: str | None, first: bool = False) -> dict:
        if kind == "chat":
            d = {"content": delta} if delta is not None else {}
            if first:
                d = {"role": "assistant", **d}
            return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": i, "delta": d, "finish_reason": finish}]}
        return {"id": rid, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": i, "text": delta or "", "logprobs": None, "finish_reason": finish}]}

    def reason(i: int) -> str:
        r = streams[i].finish_reason or (reqs[i].finish_reason if reqs[i] is not None else None)
        return "stop" if r == "stop" else "length"

    async def updates():
        """(choice, StepOutput) until every choice has finished (or its text hit a stop)."""
        open_ = set(range(n))
        while open_:
            try:
                i, item = await asyncio.wait_for(merged.get(), timeout=1.0)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    return
                continue
            if item is None:
                open_.discard(i)
                continue
            if isinstance(item, BaseException):
                raise item
            if done[i]:
                continue
            reqs[i] = item.request
            yield i, item
            if done[i]:
                open_.discard(i)
                if not item.finished:  # a stop string ended it: the engine need not go on
                    engine.abort(names[i])

    def step(i: int, out) -> str:
        delta = streams[i].add(out.new_ids)
        done[i] = out.finished or streams[i].finish_reason is not None
        return delta

    def cleanup() -> None:
        for i, name in enumerate(names):
            if not done[i]:
                engine.abort(name)
        for t in forwarders:
            t.cancel()

    if body.stream:
        async def events():
            first = [True] * n
            try:
                async for i, out in updates():
                    delta = step(i, out)
                    if delta:
                        yield _sse(chunk(i, delta, None, first[i]))
                        first[i] = False
                    if done[i]:
                        tail = streams[i].flush()
                        if tail or first[i]:
                            yield _sse(chunk(i, tail, None, first[i]))
                        yield _sse(chunk(i, None, reason(i)))
                if all(done):
                    if body.stream_options and body.stream_options.include_usage:
                        yield _sse({"id": rid, "object": chunk(0, None, None)["object"], "created": created,
                                    "model": model, "choices": [], "usage": _usage(reqs, streams, len(ids))})
                    yield "data: [DONE]\n\n"
            except Exception as e:  # an error after the stream started: an error event, then close
                yield _sse({"error": {"message": f"{type(e).__name__}: {e}", "type": "server_error", "code": 500}})
            finally:
                cleanup()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    try:
        async for i, out in updates():
            step(i, out)
    finally:
        cleanup()
    if not all(done):
        raise APIError(499, "client closed the request")
    for st in streams:
        st.flush()
    usage = _usage(reqs, streams, len(ids))
    if kind == "chat":
        choices = [{"index": i, "message": {"role": "assistant", "content": st.text}, "finish_reason": reason(i)}
                   for i, st in enumerate(streams)]
        return {"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": choices,
                "usage": usage}
    choices = [{"index": i, "text": st.text, "logprobs": None, "finish_reason": reason(i)}
               for i, st in enumerate(streams)]
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": choices,
            "usage": usage}


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def _prometheus(engine: AsyncEngine) -> str:
    m = engine.metrics
    lines = [
        "# HELP unmask_requests_running Requests in the running batch.", "# TYPE unmask_requests_running gauge",
        f"unmask_requests_running {engine.num_running}",
        "# HELP unmask_requests_waiting Requests queued.", "# TYPE unmask_requests_waiting gauge",
        f"unmask_requests_waiting {engine.num_waiting}",
        "# HELP unmask_requests_total Requests that ended, by how.", "# TYPE unmask_requests_total counter",
        f'unmask_requests_total{{status="finished"}} {m.finished}',
        f'unmask_requests_total{{status="aborted"}} {m.aborted}',
        "# HELP unmask_request_forwards_total Forwards summed over requests (NFE).",
        "# TYPE unmask_request_forwards_total counter", f"unmask_request_forwards_total {m.nfe}",
        "# HELP unmask_tokens_committed_total Tokens committed.", "# TYPE unmask_tokens_committed_total counter",
        f"unmask_tokens_committed_total {m.tokens}",
        "# HELP unmask_tokens_per_forward Tokens committed per request-forward.",
        "# TYPE unmask_tokens_per_forward gauge", f"unmask_tokens_per_forward {m.tokens / m.nfe if m.nfe else 0.0}",
    ]
    lines += m.step_seconds.prometheus("unmask_step_seconds", "Engine step time.")
    lines += m.ttft.prometheus("unmask_time_to_first_token_seconds", "Arrival to the first committed token.")
    return "\n".join(lines) + "\n"
