"""The Responses API's request body (`POST /v1/responses`, text only): `input` as text or
messages, `instructions`, `max_output_tokens`, sampling, `text.format` for structured output,
unmask's knobs as extra fields as on the other endpoints; the server decodes it as the chat
completion it is (`ResponsesRequest.as_chat`, server/responses.py)."""

from typing import Literal

from pydantic import BaseModel, Field, create_model

from unmask.errors import UnmaskError
from unmask.params import PARAM_FIELDS, field_type
from unmask.server.protocol import (EXTRA_FIELDS, STRICT, ChatMessage, ChatRequest, JsonSchemaFormat,
                                    ResponseFormat)


class ContentPart(BaseModel):
    """A piece of a Responses API message's content (text only: unmask serves text models)."""
    model_config = STRICT
    type: Literal["input_text", "output_text", "text"]
    text: str
    annotations: list | None = None


class InputMessage(BaseModel):
    """One item of a Responses API `input` list: a message (its content text or text parts)."""
    model_config = STRICT
    type: Literal["message"] | None = None
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class TextFormat(BaseModel):
    """The Responses API's `text.format`: plain text, any JSON object, or JSON valid against a schema."""
    model_config = STRICT
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(default=None, max_length=64)
    description: str | None = None
    schema_: dict | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(BaseModel):
    model_config = STRICT
    format: TextFormat | None = None


class _ResponsesFields(BaseModel):
    model_config = STRICT

    model: str | None = None
    input: str | list[InputMessage]
    instructions: str | None = None  # a system message before the input
    max_output_tokens: int | None = Field(default=None, ge=1)  # the canvas length (gen_length)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    stream: bool = False
    store: bool | None = None  # nothing is stored: previous_response_id is not served
    metadata: dict[str, str] | None = None
    user: str | None = None
    text: TextConfig | None = None  # structured output
    truncation: Literal["disabled"] | None = None
    parallel_tool_calls: bool | None = None
    tools: list[dict] | None = Field(default=None, max_length=0)  # no tools on this endpoint (chat serves them)
    tool_choice: Literal["none"] | None = None
    ignore_eos: bool = False


_ResponsesKnobs = create_model("_ResponsesKnobs", __base__=_ResponsesFields,
                               **{f: (field_type(PARAM_FIELDS[f]) | None, None) for f in EXTRA_FIELDS})


class ResponsesRequest(_ResponsesKnobs):
    """POST /v1/responses: OpenAI's Responses API for text — `input` (text or messages),
    `instructions`, `max_output_tokens`, sampling, `text.format` (structured output), streamed as
    typed events or whole; unmask's knobs as extra fields, as on the other endpoints. `as_chat`
    is the same request as a chat completion, which the server decodes."""

    def as_chat(self) -> ChatRequest:
        """The chat completion this response is (one choice; instructions as a system message)."""
        items = [InputMessage(role="user", content=self.input)] if isinstance(self.input, str) else list(self.input)
        messages = ([ChatMessage(role="system", content=self.instructions)] if self.instructions is not None else [])
        messages += [ChatMessage(role="system" if m.role == "developer" else m.role, content=m.text()) for m in items]
        if not messages or not any(m.role == "user" for m in messages):
            raise UnmaskError("input needs a user message", param="input")
        fmt = self.text.format if self.text is not None else None
        response_format = None
        if fmt is not None and fmt.type != "text":
            if fmt.type == "json_schema" and fmt.schema_ is None:
                raise UnmaskError("text.format json_schema needs its schema", param="text")
            response_format = ResponseFormat(type=fmt.type, json_schema=None if fmt.type == "json_object" else
                                             JsonSchemaFormat(name=fmt.name or "response", schema=fmt.schema_))
        knobs = {f: getattr(self, f) for f in EXTRA_FIELDS if getattr(self, f) is not None}
        return ChatRequest(messages=messages, max_tokens=self.max_output_tokens, temperature=self.temperature,
                           top_p=self.top_p, seed=self.seed, stream=self.stream, user=self.user,
                           response_format=response_format, ignore_eos=self.ignore_eos, **knobs)
