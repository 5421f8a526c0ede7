"""`unmask serve`: an OpenAI-compatible HTTP server over the request-level engine.

Endpoints: GET /health, GET /v1/models, POST /v1/completions, POST /v1/chat/completions,
POST /v1/responses (OpenAI's Responses API for text: a chat completion answered as a response),
the infill endpoints editors call (fim.py: POST /v1/fim/completions, Mistral's and Inception's;
POST /infill, llama.cpp's),
GET /metrics (Prometheus text), and the playground: GET / (a page) with its per-step event stream
POST /playground/stream. Requests are batched continuously by the engine; streams send the
committed prefix (completion.py). Errors use OpenAI's shape: 400 for bad parameters or malformed
JSON, 401 without the API key, 404 for another model name, 429 when the queue is full.

The pieces: protocol.py and protocol_infill.py (request bodies), requests.py (prompt and parameter checks), completion.py
(one request's choices, streamed or whole; rounds.py: a template's bounded holes one by one), openai.py (response shapes), text.py (the committed
text stream), playground.py, metrics.py, async_engine.py (the engine's thread).
"""

from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from unmask.engine import EngineConfig
from unmask.errors import UnmaskError
from unmask.llm import LLM
from unmask.server import playground
from unmask.server.async_engine import AsyncEngine
from unmask.server.completion import Completion
from unmask.server.fim import LlamaInfill, empty_infill
from unmask.server.metrics import prometheus
from unmask.server.openai import APIError, error_response
from unmask.server.protocol import ChatRequest, CompletionRequest
from unmask.server.protocol_responses import ResponsesRequest
from unmask.server.protocol_infill import FimRequest, LlamaInfillRequest
from unmask.inputs import check_prompts, check_suffix
from unmask.server.requests import (check_model, check_text, encode, grammar_for, infill, logprobs_for, params_for,
                                    special_strings)
from unmask.server.responses import Response
from unmask.server.text import TextStream

__all__ = ["build_app", "APIError", "TextStream"]


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
    _handlers(app, api_key)
    specials = special_strings(llm)
    kind = llm.takes.label  # masked, autoregressive or renoising (the playground's view)
    hole = llm.takes.suffix is None  # its rows read text after a hole (engine/kind.py Takes)

    @app.get("/health")
    async def health():
        engine: AsyncEngine = state["engine"]
        if engine.error is not None:
            return error_response(503, f"the engine stopped: {engine.error}", "server_error")
        return {"status": "ok", "running": engine.num_running, "waiting": engine.num_waiting}

    @app.get("/", response_class=HTMLResponse)
    async def page():
        return playground.page(kind, hole)

    @app.post("/playground/stream")
    async def playground_stream(body: CompletionRequest, request: Request):
        prompt = body.prompt_value()
        if not isinstance(prompt, str):
            raise APIError(400, "the playground takes a text prompt", param="prompt")
        check_text(prompt, specials, "prompt")
        ids = encode(llm, prompt, chat=False)
        params = params_for(llm, body, ids)
        ids, params, holes, _ = infill(llm, body, ids, params, specials)  # a hole: text after it (suffix)
        return playground.stream(state["engine"], llm, ids, params, body.stops(), holes)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served_model_name, "object": "model", "created": 0,
                                            "owned_by": "unmask", "max_model_len": llm.arch.max_positions}]}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(prometheus(state["engine"]), media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        check_model(body.model, served_model_name)
        prompt = body.prompt_value()
        if body.template:  # the prompt is read as a template (requests.infill)
            ids = []
        elif isinstance(prompt, str):
            check_text(prompt, specials, "prompt")
            ids = encode(llm, prompt, chat=False)
        else:
            ids = list(prompt)
        params = params_for(llm, body, ids, check=not body.template)
        top = logprobs_for(llm, body)
        ids, params, holes, template = infill(llm, body, ids, params, specials)
        grammar = await grammar_for(state["engine"], body, params, holes)
        if grammar is not None:
            holes = {**holes, "constraint": grammar}
        return await Completion(state["engine"], llm, body, ids, params, request, "completion", served_model_name,
                                holes, template, top).respond()

    @app.post("/v1/fim/completions")
    async def fim(body: FimRequest, request: Request):
        """Mistral's / Inception's FIM: a completion with a suffix, answered as a chat completion."""
        check_model(body.model, served_model_name)
        check_text(body.prompt, specials, "prompt")
        ids = encode(llm, body.prompt, chat=False)
        params = params_for(llm, body, ids)
        ids, params, holes, _ = infill(llm, body, ids, params, specials)
        return await Completion(state["engine"], llm, body, ids, params, request, "chat", served_model_name,
                                holes).respond()

    @app.post("/infill")
    async def llama_infill(body: LlamaInfillRequest, request: Request):
        """llama.cpp's /infill (llama.vim, llama.vscode): the same middle, in llama.cpp's shape."""
        if body.n_predict == 0:
            return empty_infill(body, served_model_name)
        prefix = body.prefix_text()
        for where, text in (("input_prefix", prefix), ("input_suffix", body.input_suffix)):
            check_text(text, specials, where)
        if not prefix.strip():
            raise APIError(400, "input_prefix (with prompt and input_extra) is empty: unmask fills a hole after some "
                                "text", param="input_prefix")
        ids = encode(llm, prefix, chat=False)
        try:
            params = llm.params_for(body.generation_fields())
            check_prompts([ids], params, llm.arch, llm.token_ids)
            body.stops()
        except UnmaskError as e:
            raise APIError(400, str(e), param=e.param) from None
        holes: dict = {}
        if body.input_suffix:
            suffix = llm.tokenizer.encode(body.input_suffix, add_special_tokens=False)
            unknown = llm.tokenizer.unknown_words(body.input_suffix)
            if unknown:
                raise APIError(400, f"input_suffix: not in the vocabulary: {', '.join(map(repr, unknown[:8]))}",
                               param="input_suffix")
            try:
                check_suffix(suffix, params, llm.arch, llm.token_ids, len(ids), llm.takes)
            except UnmaskError as e:
                raise APIError(400, str(e), param="input_suffix") from None
            holes = {"suffix": suffix}
        return await LlamaInfill(state["engine"], llm, body, ids, params, request, "completion", served_model_name,
                                 holes).respond()

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        check_model(body.model, served_model_name)
        for i, m in enumerate(body.messages):
            try:
                m.check(i)
            except UnmaskError as e:
                raise APIError(400, str(e), param=e.param) from None
            if m.content is not None:
                check_text(m.content, specials, f"messages.{i}.content")
        return await _complete(state["engine"], llm, body, _chat_ids(llm, body), request, "chat", served_model_name)

    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest, request: Request):
        check_model(body.model, served_model_name)
        try:
            chat = body.as_chat()
        except UnmaskError as e:
            raise APIError(400, str(e), param=e.param) from None
        for i, m in enumerate(chat.messages):
            check_text(m.content, specials, f"input.{i}")
        ids = _chat_ids(llm, chat)
        params = params_for(llm, chat, ids)
        grammar = await grammar_for(state["engine"], chat, params, {})
        return await Response(state["engine"], llm, chat, ids, params, request, "chat", served_model_name,
                              None if grammar is None else {"constraint": grammar}, request_body=body).respond()

    return app


async def _complete(engine: AsyncEngine, llm: LLM, body, ids: list[int], request: Request, kind: str, model: str):
    params = params_for(llm, body, ids)
    top = logprobs_for(llm, body)
    grammar = await grammar_for(engine, body, params, {})
    call = body.forced_call() if kind == "chat" else None
    return await Completion(engine, llm, body, ids, params, request, kind, model,
                            None if grammar is None else {"constraint": grammar}, logprobs=top, call=call).respond()


def _chat_ids(llm: LLM, body: ChatRequest) -> list[int]:
    """The conversation as prompt ids: through the chat template (with the tools, as templates
    that describe them take them), else the last user message."""
    llm.tokenizer.check_length("".join(m.content or "" for m in body.messages), llm.arch.max_positions, "messages")
    messages = [m.for_template() for m in body.messages]
    if llm.tokenizer.chat_template is not None:
        tools = None if not body.tools or body.tool_choice == "none" else [t.model_dump(exclude_none=True)
                                                                         for t in body.tools]
        try:
            text = llm.tokenizer.apply_chat_template(messages, tools=tools)
        except UnmaskError as e:
            raise APIError(400, str(e)) from None
        return llm.tokenizer.encode(text, add_special_tokens=False)
    users = [m["content"] for m in messages if m["role"] == "user"]  # no chat template: the last user message
    if not users:
        raise APIError(400, "messages need a user message", param="messages")
    return encode(llm, users[-1], chat=False)


def _handlers(app: FastAPI, api_key: str | None) -> None:
    """OpenAI-shaped errors for every failure, and the API key on /v1/, /playground/ and /infill."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return error_response(e.status, e.message, e.type, e.param)

    @app.exception_handler(UnmaskError)
    async def _unmask_error(request: Request, e: UnmaskError):
        return error_response(400, str(e), param=e.param)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        if first.get("type") == "json_invalid":  # the body is not JSON: name the body, not a byte offset
            error = (first.get("ctx") or {}).get("error")
            return error_response(400, f"body: not valid JSON{f' ({error})' if error else ''}", param="body")
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        return error_response(400, f"{where}: {first.get('msg', 'invalid request')}" if where
                              else first.get("msg", "invalid"), param=where or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException):
        return error_response(e.status_code, str(e.detail),
                              "not_found_error" if e.status_code == 404 else "invalid_request_error")

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        if api_key is not None and request.url.path.startswith(("/v1/", "/playground/", "/infill")):
            if request.headers.get("authorization") != f"Bearer {api_key}":
                return error_response(401, "missing or wrong API key (Authorization: Bearer ...)", "authentication_error")
        return await call_next(request)
