"""One completion or chat request with `n` choices: n engine requests (choice i samples with seed
+ i when a seed is given), streamed together, each with its choice index, or returned together.

A stream sends only the committed left prefix of each answer: text is never retracted, a chunk
goes out as soon as the contiguous committed prefix grows, a stop string is honoured across
chunk boundaries, and the last chunk carries finish_reason (and usage with
stream_options.include_usage). An error after the stream started is sent as an error event
before the stream closes; a client that disconnects aborts its requests."""

import asyncio
import json
import time
import uuid
from dataclasses import replace

from fastapi import Request
from fastapi.responses import StreamingResponse

from unmask import holes as holes_
from unmask.errors import UnmaskError
from unmask.inputs import layout
from unmask.llm import LLM
from unmask.params import GenerationParams
from unmask.server import openai
from unmask.server.async_engine import AsyncEngine, QueueFull
from unmask.server.openai import APIError, sse
from unmask.server.rounds import HoleRounds
from unmask.server.text import TextStream

MASK_GLYPH = "\u2591"  # a diffusing chunk's open position (light shade)


class Completion(HoleRounds):
    def __init__(self, engine: AsyncEngine, llm: LLM, body, ids: list[int], params: GenerationParams,
                 request: Request, kind: str, model: str, holes: dict | None = None, template=None,
                 logprobs: int | None = None, call=None) -> None:
        """`holes`: what the engine takes besides the prompt (Engine.add_request): infilling's
        suffix and fill, structured output's grammar state (`constraint`); `template`
        (unmask.holes.Template): each choice then also carries its holes' texts; `logprobs`:
        None, or the most likely tokens to report beside each chosen one; `call`
        (server/protocol.py ForcedCall): each chat choice is that tool call, its output the
        call's arguments (a named function) or the function's name and arguments ("required"),
        held to their schema by the constraint in `holes`."""
        self.engine, self.body, self.ids, self.request, self.kind, self.model = engine, body, ids, request, kind, model
        self.holes, self.template = dict(holes or {}), template
        # a template whose holes' lengths are bounds: one engine request per hole, left to right
        # (holes.Template.round), with the parameters the template was given (requests.infill)
        self.rounds: GenerationParams | None = self.holes.pop("rounds", None)
        self.top = logprobs
        if logprobs is not None:
            self.holes = {**self.holes, "logprobs": logprobs}
        self.offsets = [0] * body.n  # each choice's characters whose logprobs went out (text_offset)
        self.call = call
        self.diffusing = bool(getattr(body, "diffusing", False))
        if self.diffusing and not body.stream:
            raise APIError(400, "diffusing streams the canvas as it fills: it needs stream true", param="diffusing")
        if self.diffusing and (logprobs is not None or call is not None):
            raise APIError(400, "diffusing streams whole canvases: no logprobs or forced tool calls with it",
                           param="diffusing")
        holed = self.holes.get("suffix") or template is not None
        if self.diffusing and holed and (self.rounds or params).hole_length == "consensus":
            raise APIError(400, "diffusing streams one canvas as it fills; hole_length 'consensus' decodes the hole at "
                           "several lengths and answers once they are done", param="diffusing")
        self.call_ids = [f"call_{uuid.uuid4().hex[:24]}" for _ in range(body.n)] if call is not None else []
        self.rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.n = body.n
        self.names = [self.rid] if self.n == 1 else [f"{self.rid}-{i}" for i in range(self.n)]
        self.live = list(self.names)  # each choice's engine request now (a template's: its hole's)
        suffix = self.holes.get("suffix") if holes_.ends_at_suffix(params) and template is None else None
        self.streams = [TextStream(llm, body.stops(), template, suffix,
                                  self.rounds is not None and holes_.ends_at_suffix(self.rounds))
                        for _ in range(self.n)]
        self.reqs: list = [None] * self.n
        self.done = [False] * self.n
        self.created = int(time.time())
        self.merged: asyncio.Queue = asyncio.Queue()
        self.forwarders: list[asyncio.Task] = []
        self._submit(params)

    def _submit(self, params: GenerationParams) -> None:
        if self.rounds is not None:
            return self._submit_rounds()
        grammar = self.holes.get("constraint")  # structured output: each choice its own grammar state

        def submit(i: int) -> asyncio.Queue:
            seed = None if params.seed is None else params.seed + i
            extra = self.holes if grammar is None or i == 0 else {**self.holes, "constraint": grammar.copy()}
            return self.engine.submit(self.names[i], self.ids, replace(params, seed=seed), watch=self.diffusing,
                                      **extra)

        self._start(submit, self._forward)

    def _start(self, submit, forward) -> None:
        """Each choice's first engine request (`submit(i)` -> its queue), then `forward(i, queue)`
        for each; a full queue is a 429 and what was already queued is taken back."""
        queues = []
        try:
            for i in range(self.n):
                queues.append(submit(i))
        except (QueueFull, UnmaskError) as e:
            for rid in self.live[: len(queues)]:
                self.engine.abort(rid)
            if isinstance(e, QueueFull):
                raise APIError(429, str(e), "rate_limit_error") from None
            raise APIError(503, str(e), "server_error") from None
        self.forwarders = [asyncio.create_task(forward(i, q)) for i, q in enumerate(queues)]

    async def _forward(self, i: int, q: asyncio.Queue) -> None:
        while True:
            item = await q.get()
            await self.merged.put((i, item))
            if item is None or isinstance(item, BaseException):
                return

    async def updates(self):
        """(choice, StepOutput) until every choice has finished (or its text hit a stop)."""
        open_ = set(range(self.n))
        while open_:
            try:
                i, item = await asyncio.wait_for(self.merged.get(), timeout=1.0)
            except asyncio.TimeoutError:
                if await self.request.is_disconnected():
                    return
                continue
            if item is None:
                open_.discard(i)
                continue
            if isinstance(item, BaseException):
                raise item
            if self.done[i]:
                continue
            self.reqs[i] = item.request
            yield i, item
            if self.done[i]:
                open_.discard(i)
                if not item.finished:  # a stop string ended it: the engine need not go on
                    self.engine.abort(self.live[i])

    def step(self, i: int, out) -> str:
        delta = self.streams[i].add(out.new_ids, out.logprobs)
        self.done[i] = out.finished or self.streams[i].finish_reason is not None
        return delta

    @property
    def prompt_tokens(self) -> int:
        """The tokens the model reads besides what it writes: the prompt, the suffix (laid out as
        the model reads them: an autoregressive model's prefix-suffix-middle adds its three
        markers) and a template's fixed text between holes."""
        fixed = 0 if self.template is None else len(self.template.region) - self.template.masks
        llm = self.streams[0].llm
        prompt, suffix = layout(list(self.ids), list(self.holes.get("suffix") or []), llm.takes, llm.token_ids)
        return len(prompt) + len(suffix) + fixed

    def reason(self, i: int) -> str:
        if self.template is not None:  # every hole ended with an end of text
            return "stop" if self.streams[i].ends == len(self.template.holes) else "length"
        r = self.streams[i].finish_reason or (self.reqs[i].finish_reason if self.reqs[i] is not None else None)
        if r == "stop" and self.call is not None:
            return "tool_calls"
        return "stop" if r == "stop" else "length"

    def tool_call(self, i: int) -> dict:
        """Choice i's tool call from its whole output (OpenAI's shape)."""
        text = self.streams[i].text
        if self.call.name is not None:  # the output is the named function's arguments
            return openai.tool_call(self.call_ids[i], self.call.name, text)
        try:  # "required": {"name": ..., "arguments": ...}, held to that shape by the grammar
            got = json.loads(text)
            return openai.tool_call(self.call_ids[i], got["name"], json.dumps(got["arguments"]))
        except (ValueError, KeyError, TypeError):  # cut at max_tokens before the grammar finished
            return openai.tool_call(self.call_ids[i], "", text)

    def cleanup(self) -> None:
        for i, name in enumerate(self.live):
            if not self.done[i]:
                self.engine.abort(name)
        for t in self.forwarders:
            t.cancel()

    def _logprobs(self, i: int) -> dict | None:
        """Choice i's logprobs of the tokens whose text went out since the last call (None
        without logprobs)."""
        if self.top is None:
            return None
        entries = self.streams[i].take()
        out = openai.logprobs(self.kind, entries, self.offsets[i])
        self.offsets[i] += sum(len(t) for t, _, _ in entries)
        return out

    def _chunk(self, i: int, delta: str | None, finish: str | None, first: bool = False, lps=None) -> dict:
        return openai.chunk(self.kind, self.rid, self.created, self.model, i, delta, finish, first, lps)

    def _delta(self, i: int, text: str, first: bool):
        """What a chat choice's chunk carries for its next `text`: the text, or with a forced
        call its arguments (a named function: as they grow; "required": the whole call once
        its output is done, since its name comes first inside it)."""
        if self.call is None:
            return text
        if self.call.name is None:
            if not self.done[i]:
                return ""
            c = self.tool_call(i)
            return openai.tool_delta(self.call_ids[i], c["function"]["name"], c["function"]["arguments"])
        return openai.tool_delta(self.call_ids[i] if first else None, self.call.name, text)

    def canvas_text(self, out) -> str:
        """A diffusing chunk's text: the answer canvas after this step, committed tokens as text
        and each open position as MASK_GLYPH, up to its first end of text."""
        canvas = out.canvas or []
        stops, mask = set(self.streams[0].stop_ids), self.streams[0].llm.token_ids.mask
        end = next((k for k, t in enumerate(canvas) if t in stops), len(canvas))
        pieces, run = [], []
        for t in canvas[:end]:
            if t == mask:
                if run:
                    pieces.append(self.streams[0].llm.tokenizer.decode(run))
                    run = []
                pieces.append(MASK_GLYPH)
            else:
                run.append(t)
        if run:
            pieces.append(self.streams[0].llm.tokenizer.decode(run))
        return "".join(pieces)

    def streamed(self):
        """What a streamed response sends: OpenAI's framing around the committed-prefix chunks, or
        the diffusing ones (a subclass with its own shape and framing returns its own events)."""
        return self.stream(self.diffusing_events() if self.diffusing else self.events())

    async def stream(self, chunks):
        """An OpenAI stream: the `chunks` (server-sent events per update), then usage when asked
        and [DONE]; an error after the stream started is an error event before it closes."""
        try:
            async for event in chunks:
                yield event
            if all(self.done):
                if self.body.stream_options and self.body.stream_options.include_usage:
                    use = openai.usage(self.reqs, self.streams, self.prompt_tokens)
                    yield sse(openai.usage_chunk(self.kind, self.rid, self.created, self.model, use))
                yield "data: [DONE]\n\n"
        except Exception as e:  # an error after the stream started: an error event, then close
            yield sse({"error": {"message": f"{type(e).__name__}: {e}", "type": "server_error", "code": 500}})
        finally:
            self.cleanup()

    async def diffusing_events(self):
        """Inception's diffusing stream: per step, each choice's whole canvas (replacing its last
        chunk); its final chunk the answer as a whole response has it, with finish_reason."""
        async for i, out in self.updates():
            self.step(i, out)
            if not self.done[i]:
                if out.canvas is not None:
                    yield sse(self._chunk(i, self.canvas_text(out), None, False))
                continue
            self.streams[i].flush()
            yield sse(self._chunk(i, self.streams[i].text, self.reason(i), False))

    async def events(self):
        first = [True] * self.n
        async for i, out in self.updates():
            delta = self.step(i, out)
            if self.call is not None and self.call.name is None:  # "required": nothing until it is whole
                delta = ""
            lps = self._logprobs(i)
            if delta or (lps is not None and lps.get("content", lps.get("tokens"))):
                yield sse(self._chunk(i, self._delta(i, delta, first[i]), None, first[i], lps))
                first[i] = False
            if self.done[i]:
                tail = self.streams[i].flush()
                lps = self._logprobs(i)
                whole_call = self.call is not None and self.call.name is None
                if tail or first[i] or whole_call or (lps is not None and lps.get("content", lps.get("tokens"))):
                    yield sse(self._chunk(i, self._delta(i, tail, first[i]), None, first[i], lps))
                last = self._chunk(i, None, self.reason(i))
                if self.template is not None:  # unmask's: each hole's text, with the finish
                    last["choices"][0]["holes"] = self.streams[i].hole_texts()
                yield sse(last)

    async def whole(self) -> dict:
        try:
            async for i, out in self.updates():
                self.step(i, out)
        finally:
            self.cleanup()
        if not all(self.done):
            raise APIError(499, "client closed the request")
        for st in self.streams:
            st.flush()
        use = openai.usage(self.reqs, self.streams, self.prompt_tokens)
        calls = [self.tool_call(i) for i in range(self.n)] if self.call is not None else None
        out = openai.response(self.kind, self.rid, self.created, self.model, [st.text for st in self.streams],
                              [self.reason(i) for i in range(self.n)], use, [self._logprobs(i) for i in range(self.n)],
                              calls)
        if self.template is not None:  # unmask's: each hole's text
            for choice, st in zip(out["choices"], self.streams):
                choice["holes"] = st.hole_texts()
        return out

    async def respond(self):
        if self.body.stream:
            return StreamingResponse(self.streamed(),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await self.whole()
