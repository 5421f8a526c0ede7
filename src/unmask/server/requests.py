"""A request body's prompt and parameters, checked before it reaches the engine: prompt text
that holds a special token's literal text is refused by name (it would be read as that token),
and the decoding fields go through the model's one definition of what it accepts."""

from unmask.errors import UnmaskError
from unmask.inputs import check_prompts
from unmask.llm import LLM
from unmask.params import GenerationParams
from unmask.server.openai import APIError


def special_strings(llm: LLM) -> list[str]:
    decoder = llm.tokenizer.tok.get_added_tokens_decoder()
    return sorted({t.content for t in decoder.values() if t.special}, key=len, reverse=True)


def check_text(text: str, specials: list[str], where: str) -> None:
    hit = next((s for s in specials if s in text), None)
    if hit is not None:
        raise APIError(400, f"{where} contains the special token text {hit!r}; it would be read as that token, "
                            "not as text (send token ids to use special tokens)", param=where)


def check_model(name: str | None, served: str) -> None:
    if name is not None and name != served:
        raise APIError(404, f"model {name!r} does not exist; this server serves {served!r}", "not_found_error", "model")


def encode(llm: LLM, text: str, chat: bool) -> list[int]:
    try:
        return llm.encode([text], chat=chat)[0]
    except UnmaskError as e:
        raise APIError(400, str(e), param="prompt") from None


def params_for(llm: LLM, body, ids: list[int]) -> GenerationParams:
    """The request's fields, then the model's defaults, then the fast defaults (not for an
    autoregressive model), accepted for this model (unmask.accept): a 400 names what is wrong."""
    fields = body.generation_fields()
    try:
        params = llm.params_for(fields)
        check_prompts([ids], params, llm.arch, llm.token_ids)
        body.stops()
    except UnmaskError as e:
        raise APIError(400, str(e), param=e.param) from None
    return params
