"""OpenAI-compatible request bodies, with unmask's diffusion knobs as extra fields (generated from
GenerationParams' fields, so a new knob is a request field without a line here).

Unknown fields are refused (400) rather than ignored, so a misspelt knob never silently does
nothing, and types are strict (a string is not a boolean, a boolean not a number); the OpenAI fields that unmask accepts but cannot honour are listed with the values it
takes (e.g. `echo` only false)."""

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


class ChatMessage(BaseModel):
    model_config = STRICT
    role: Literal["system", "user", "assistant"]
    content: str
    name: str | None = None


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=TOP_LOGPROBS)

    def logprob_count(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise UnmaskError("top_logprobs needs logprobs: true", param="top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None
