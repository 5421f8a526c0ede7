"""POST /v1/responses: OpenAI's Responses API for text, over the same engine requests as a chat
completion (protocol_responses.py ResponsesRequest.as_chat; one choice). The answer is a `response` object
with one assistant message whose content is one `output_text` part; its status is "completed",
or "incomplete" with reason max_output_tokens when the canvas filled before an end of text. A
stream sends the typed events OpenAI sends — response.created, response.in_progress,
response.output_item.added, response.content_part.added, response.output_text.delta (each as the
committed text grows), response.output_text.done, response.content_part.done,
response.output_item.done, then response.completed (or response.incomplete) — each with its
sequence_number, and no [DONE]. Nothing is stored (`store` is accepted and ignored)."""

import itertools
import json
import uuid

from unmask.server import openai
from unmask.server.completion import Completion


class Response(Completion):
    def __init__(self, *args, request_body=None, **kw) -> None:
        super().__init__(*args, **kw)
        self.rb = request_body  # the ResponsesRequest as sent (echoed in the response object)
        self.resp_id = f"resp_{uuid.uuid4().hex[:24]}"
        self.msg_id = f"msg_{uuid.uuid4().hex[:24]}"

    def _part(self, text: str) -> dict:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _item(self, status: str, text: str | None) -> dict:
        return {"id": self.msg_id, "type": "message", "status": status, "role": "assistant",
                "content": [] if text is None else [self._part(text)]}

    def _object(self, status: str, text: str | None = None) -> dict:
        """The response object: in progress (no output yet), or finished with its message."""
        rb = self.rb
        done = status != "in_progress"
        use = openai.usage(self.reqs, self.streams, self.prompt_tokens) if done else None
        fmt = rb.text.format.model_dump(by_alias=True, exclude_none=True) if rb.text and rb.text.format else None
        return {
            "id": self.resp_id, "object": "response", "created_at": self.created, "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": rb.instructions, "max_output_tokens": rb.max_output_tokens, "model": self.model,
            "output": [self._item("completed" if status == "completed" else "incomplete", text)] if done else [],
            "parallel_tool_calls": False, "temperature": rb.temperature, "top_p": rb.top_p,
            "tool_choice": "none", "tools": [], "text": {"format": fmt or {"type": "text"}}, "truncation": "disabled",
            "metadata": rb.metadata or {}, "user": rb.user, "store": False,
            "usage": None if use is None else {
                "input_tokens": use["prompt_tokens"],
                "input_tokens_details": {"cached_tokens": use["prompt_tokens_details"]["cached_tokens"]},
                "output_tokens": use["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": use["total_tokens"], "nfe": use["nfe"],
                "tokens_per_forward": use["tokens_per_forward"]},
        }

    def _status(self) -> str:
        return "completed" if self.reason(0) == "stop" else "incomplete"

    async def whole(self) -> dict:
        await super().whole()  # decodes the one choice (raises as a chat completion would)
        return self._object(self._status(), self.streams[0].text)

    def streamed(self):  # its own shape and framing
        return self.events()

    async def events(self):
        seq = itertools.count()
        part = {"item_id": self.msg_id, "output_index": 0, "content_index": 0}

        def event(kind: str, **payload) -> str:
            return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': next(seq), **payload})}\n\n"

        try:
            yield event("response.created", response=self._object("in_progress"))
            yield event("response.in_progress", response=self._object("in_progress"))
            yield event("response.output_item.added", output_index=0, item=self._item("in_progress", None))
            yield event("response.content_part.added", **part, part=self._part(""))
            async for i, out in self.updates():
                delta = self.step(i, out)
                if self.done[i]:
                    delta += self.streams[i].flush()
                if delta:
                    yield event("response.output_text.delta", **part, delta=delta, logprobs=[])
            if not all(self.done):  # the client left
                return
            text, status = self.streams[0].text, self._status()
            yield event("response.output_text.done", **part, text=text, logprobs=[])
            yield event("response.content_part.done", **part, part=self._part(text))
            yield event("response.output_item.done", output_index=0, item=self._item(status, text))
            yield event("response.completed" if status == "completed" else "response.incomplete",
                        response=self._object(status, text))
        except Exception as e:  # an error after the stream started: OpenAI's error event, then close
            yield event("error", code="server_error", message=f"{type(e).__name__}: {e}", param=None)
        finally:
            self.cleanup()
