"""The infill endpoints' request bodies: Mistral's and Inception's `/v1/fim/completions`
(`FimRequest`, OpenAI's common fields and unmask's knobs, as /v1/completions) and llama.cpp's
`/infill` (`LlamaInfillRequest`, in llama.cpp's own field names, as its editor plugins send them)."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from unmask.errors import UnmaskError
from unmask.server.protocol import STRICT, _Common


class FimRequest(_Common):
    """Mistral's and Inception's `/v1/fim/completions`: the text before the hole (`prompt`) and
    after it (`suffix`), `max_tokens`, `min_tokens`, `stop`, `stream`, `temperature`, `top_p`,
    `random_seed`; `metadata` and `prompt_cache_key` are accepted (the prefix cache needs no key).
    Answered in the chat-completion shape, as they answer it."""

    prompt: str
    suffix: str | None = None
    random_seed: int | None = None  # Mistral's name for the seed
    metadata: dict | None = None
    prompt_cache_key: str | None = None
    template: Literal[False] = False  # FIM has no templates (requests.infill reads it)

    def prompt_value(self) -> str:
        return self.prompt

    def logprob_count(self) -> None:
        return None

    def generation_fields(self) -> dict:
        if self.random_seed is not None and self.seed is not None and self.random_seed != self.seed:
            raise UnmaskError("give random_seed or seed, not two different seeds", param="random_seed")
        out = super().generation_fields()
        out["seed"] = self.random_seed if self.random_seed is not None else self.seed
        return out


class ExtraChunk(BaseModel):
    """A chunk of context from other files (llama.cpp's `input_extra`)."""
    model_config = ConfigDict(extra="ignore", strict=True)  # editors add their own fields (time, ...)
    filename: str = ""
    text: str


class LlamaInfillRequest(BaseModel):
    """llama.cpp's `/infill` as llama.vim and llama.vscode call it: `input_prefix`, `input_suffix`,
    `input_extra` (context chunks placed before the prefix), `prompt` (text typed after the prefix),
    `n_predict` (-1: the model's default length; 0: nothing generated), `stream`, `temperature`,
    `top_k`, `top_p`, `seed` (-1: none), `stop`, `n_indent` (the answer ends before a later line
    indented less), `n_cmpl` (completions; more than one: a list), `response_fields` (only these
    fields, "a/b" for a nested one). Fields llama.cpp's own scheduler and sampler chain read
    (`id_slot`, `cache_prompt`, `samplers`, `t_max_prompt_ms`, `t_max_predict_ms`, `lora`,
    `model`) are accepted and have no effect here."""
    model_config = STRICT

    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[ExtraChunk] = Field(default_factory=list)
    prompt: str = ""
    n_predict: int = Field(default=-1, ge=-1)
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0)
    top_k: int | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0, le=1)
    seed: int | None = None
    stop: list[str] | None = None
    n_indent: int = Field(default=0, ge=0)
    n_cmpl: int = Field(default=1, ge=1, le=16)
    response_fields: list[str] | None = None
    # read by llama.cpp's scheduler and sampler chain; no effect here
    id_slot: int | None = None
    cache_prompt: bool | None = None
    samplers: list[str] | None = None
    t_max_prompt_ms: int | None = None
    t_max_predict_ms: int | None = None
    lora: list[dict] | None = None
    model: str | None = None

    # what Completion reads of a body
    stream_options: None = None
    template: Literal[False] = False

    @property
    def n(self) -> int:
        return self.n_cmpl

    def stops(self) -> list[str]:
        stops = list(self.stop or [])
        if any(not s for s in stops) or len(stops) > 8:
            raise UnmaskError("stop takes at most 8 non-empty strings", param="stop")
        return stops

    def generation_fields(self) -> dict:
        """GenerationParams fields (None: the model's default; n_predict -1 is its default length)."""
        top_k = None if not self.top_k else self.top_k  # llama.cpp: 0 = off
        top_p = None if self.top_p is None or self.top_p >= 1 else self.top_p
        return {"gen_length": None if self.n_predict == -1 else self.n_predict,
                "temperature": self.temperature, "top_k": top_k, "top_p": top_p,
                "seed": None if self.seed is None or self.seed < 0 else self.seed}

    def prefix_text(self) -> str:
        """The text before the hole: the extra context (each chunk's file name, then its text),
        the prefix, and what was typed after it."""
        extra = "".join((f"{c.filename}\n" if c.filename else "") + c.text + ("" if c.text.endswith("\n") else "\n")
                        for c in self.input_extra)
        return extra + self.input_prefix + self.prompt
