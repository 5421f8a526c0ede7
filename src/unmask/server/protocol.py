"""OpenAI-compatible request bodies, with unmask's diffusion knobs as extra fields (generated from
GenerationParams' fields, so a new knob is a request field without a line here).

Unknown fields are refused (400) rather than ignored, so a misspelt knob never silently does
nothing, and types are strict (a string is not a boolean, a boolean not a number); the OpenAI fields that unmask accepts but cannot honour are listed with the values it
takes (e.g. `echo` only false)."""

import json
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from unmask.constrain import Constraint
from unmask.errors import UnmaskError
from unmask.params import PARAM_FIELDS, field_type
from unmask.sampler.logprobs import TOP_LOGPROBS


# strict types, as OpenAI's API: "yes" is not a boolean, true is not a number of tokens, "3" is not 3
STRICT = ConfigDict(extra="forbid", strict=True)


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


# GenerationParams fields a request may set as extra fields, under their own names: every field
# but the ones OpenAI names itself (temperature, top_p, seed), the one vLLM names (early_stop is
# `ignore_eos`) and the reference modes (not served: they run as their own batch offline)
OPENAI_NAMED = ("temperature", "top_p", "seed", "early_stop")
NOT_SERVED = ("compat", "alg", "eps")
EXTRA_FIELDS = tuple(f for f in PARAM_FIELDS if f not in OPENAI_NAMED + NOT_SERVED)


class JsonSchemaFormat(BaseModel):
    model_config = STRICT
    name: str = Field(default="response", max_length=64)
    description: str | None = None
    schema_: dict | bool = Field(default_factory=dict, alias="schema")
    strict: bool | None = None  # unmask always holds the output to the schema


class ResponseFormat(BaseModel):
    """OpenAI's response_format: text, any JSON object, or JSON valid against a schema."""
    model_config = STRICT
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(BaseModel):
    """vLLM's structured_outputs: one of a JSON schema, a regex, a list of choices, a grammar
    (Lark as llguidance reads it; GBNF is converted), or any JSON object."""
    model_config = STRICT
    json_: dict | bool | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class _OpenAI(BaseModel):
    model_config = STRICT

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)  # the canvas length (gen_length)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=16)  # choices; choice i samples with seed + i when a seed is given
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    frequency_penalty: Literal[0, 0.0] | None = None
    presence_penalty: Literal[0, 0.0] | None = None
    ignore_eos: bool = False  # vLLM's name: decode the whole canvas even after end of text
    response_format: ResponseFormat | None = None  # structured output (OpenAI's field)
    # Inception's "diffusing" stream: each chunk carries the whole answer canvas as it fills (open
    # positions shown), replacing the one before, instead of the committed prefix's next piece
    diffusing: bool = False
    structured_outputs: StructuredOutputs | None = None  # structured output (vLLM's field)


_Knobs = create_model("_Knobs", __base__=_OpenAI,
                      **{f: (field_type(PARAM_FIELDS[f]) | None, None) for f in EXTRA_FIELDS})


class _Common(_Knobs):
    def constraint(self) -> Constraint | None:
        """The request's structured output (response_format or structured_outputs), or None."""
        rf, so = self.response_format, self.structured_outputs
        if rf is not None and rf.type != "text" and so is not None:
            raise UnmaskError("give response_format or structured_outputs, not both", param="response_format")
        if rf is not None and rf.type == "json_object":
            return Constraint.json_schema({"type": "object"})
        if rf is not None and rf.type == "json_schema":
            if rf.json_schema is None:
                raise UnmaskError("response_format json_schema needs its json_schema object", param="response_format")
            return Constraint.json_schema(rf.json_schema.schema_)
        if so is None:
            return None
        given = {k: v for k, v in (("json", so.json_), ("regex", so.regex), ("choice", so.choice),
                                   ("grammar", so.grammar)) if v is not None}
        if so.json_object:
            given["json"] = {"type": "object"}
        if len(given) != 1:
            raise UnmaskError("structured_outputs takes exactly one of json, regex, choice, grammar and json_object",
                              param="structured_outputs")
        (kind, value), = given.items()
        return Constraint.of(kind, value)

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stops) or len(stops) > 8:
            raise UnmaskError("stop takes at most 8 non-empty strings")
        return stops

    def generation_fields(self) -> dict:
        """GenerationParams fields this request sets (None = not given)."""
        length = self.gen_length or self.max_tokens or self.max_completion_tokens
        if self.gen_length and (self.max_tokens or self.max_completion_tokens) and \
                self.gen_length != (self.max_tokens or self.max_completion_tokens):
            raise UnmaskError("give gen_length or max_tokens, not two different lengths")
        out = {f: getattr(self, f) for f in EXTRA_FIELDS}
        out.update(gen_length=length, temperature=self.temperature, top_p=self.top_p, seed=self.seed,
                   early_stop=False if self.ignore_eos else None)
        return out


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str]
    # each token's log-probability and the `logprobs` most likely tokens' (OpenAI allows 5; unmask 20)
    logprobs: int | None = Field(default=None, ge=0, le=TOP_LOGPROBS)
    echo: Literal[False] | None = None
    suffix: str | None = None  # infilling: the text after the hole (full-attention masked models)
    template: bool = False  # unmask's: the prompt is a template with holes (<|hole:N|>; unmask.holes)

    def prompt_value(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, list) and p and all(isinstance(x, str) for x in p):
            if len(p) != 1:
                raise UnmaskError("prompt: one prompt per request (send several requests for a batch)")
            p = p[0]
        if isinstance(p, list) and not p:
            raise UnmaskError("prompt is empty")
        return p

    def logprob_count(self) -> int | None:
        """None (no logprobs), or the most likely tokens to report beside each chosen one."""
        return self.logprobs


class ToolCallFunction(BaseModel):
    model_config = STRICT
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    """A call an assistant message made (a conversation sent back with the tool's result)."""
    model_config = STRICT
    id: str
    type: Literal["function"]
    function: ToolCallFunction


class ChatMessage(BaseModel):
    model_config = STRICT
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None  # None only in an assistant message that made tool calls
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant messages
    tool_call_id: str | None = None  # tool messages: the call they answer

    def check(self, i: int) -> None:
        where = f"messages.{i}"
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise UnmaskError(f"{where}.content is required (only an assistant message with tool_calls may omit it)",
                              param=f"{where}.content")
        if self.tool_calls is not None and self.role != "assistant":
            raise UnmaskError(f"{where}.tool_calls: only an assistant message makes tool calls", param=f"{where}.tool_calls")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise UnmaskError(f"{where}: a tool message needs tool_call_id, and only a tool message has one",
                              param=f"{where}.tool_call_id")

    def for_template(self) -> dict:
        """The message as chat templates read it (a call's JSON arguments as an object, as
        templates that write `arguments | tojson` expect)."""
        out = {"role": self.role, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)}}
                                 for c in self.tool_calls]
        return out


def _arguments(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


class FunctionSpec(BaseModel):
    model_config = STRICT
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict | None = None  # a JSON schema of the arguments (none: any JSON object)
    strict: bool | None = None  # unmask always holds a forced call's arguments to `parameters`


class Tool(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: FunctionSpec


class ToolName(BaseModel):
    model_config = STRICT
    name: str


class NamedToolChoice(BaseModel):
    model_config = STRICT
    type: Literal["function"]
    function: ToolName


@dataclass(frozen=True)
class ForcedCall:
    """A tool call the request forces: `name` (a named function; None for "required", where the
    output names its function), and the constraint its output is held to."""

    name: str | None
    constraint: Constraint


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=TOP_LOGPROBS)
    tools: list[Tool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # a forced call is one call

    def forced_call(self) -> ForcedCall | None:
        """The tool call this request forces (tool_choice "required" or a named function: the
        output is held to the arguments' schema, structured output's way), or None (no tools, or
        tool_choice "none"). "auto" is refused by name: choosing between text and a call needs a
        parser of the model's own tool-call format."""
        choice, tools = self.tool_choice, self.tools
        if not tools:
            if choice not in (None, "none"):
                raise UnmaskError("tool_choice needs tools", param="tool_choice")
            return None
        names = [t.function.name for t in tools]
        if len(set(names)) != len(names):
            raise UnmaskError(f"tools: function names must be distinct ({', '.join(names)})", param="tools")
        if choice == "none":
            return None
        if choice in (None, "auto"):
            raise UnmaskError("tool_choice 'auto' (the default when tools are given) lets the model choose between "
                              "text and a tool call, which needs a parser of this model's own tool-call format; "
                              "unmask has none: give tool_choice 'required' or {'type': 'function', 'function': "
                              "{'name': ...}} (the call's arguments are then held to the function's parameters), "
                              "or 'none'", param="tool_choice")
        schema = {t.function.name: t.function.parameters or {"type": "object"} for t in tools}
        if isinstance(choice, NamedToolChoice):
            name = choice.function.name
            if name not in schema:
                raise UnmaskError(f"tool_choice names {name!r}, which is not among the tools ({', '.join(names)})",
                                  param="tool_choice")
            return ForcedCall(name, Constraint.json_schema(schema[name]))
        calls = [{"type": "object", "properties": {"name": {"const": n}, "arguments": s},
                  "required": ["name", "arguments"], "additionalProperties": False} for n, s in schema.items()]
        return ForcedCall(None, Constraint.json_schema(calls[0] if len(calls) == 1 else {"anyOf": calls}))

    def constraint(self) -> Constraint | None:
        call = self.forced_call()
        if call is None:
            return super().constraint()
        rf = self.response_format
        if self.structured_outputs is not None or (rf is not None and rf.type != "text"):
            raise UnmaskError("give a forced tool call or structured output (response_format, structured_outputs), "
                              "not both", param="tool_choice")
        return call.constraint

    def logprob_count(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise UnmaskError("top_logprobs needs logprobs: true", param="top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None
