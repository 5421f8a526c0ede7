"""A request body's prompt and parameters, checked before it reaches the engine: prompt text
that holds a special token's literal text is refused by name (it would be read as that token),
and the decoding fields go through the model's one definition of what it accepts."""

import asyncio

from unmask import holes
from unmask.errors import UnmaskError
from unmask.inputs import check_prompts, check_suffix
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


def params_for(llm: LLM, body, ids: list[int], check: bool = True) -> GenerationParams:
    """The request's fields, then the model's defaults, then the fast defaults (not for an
    autoregressive model), accepted for this model (unmask.engine.accept): a 400 names what is wrong.
    `check`: the prompt ids against them (a template's are checked by `infill`)."""
    fields = body.generation_fields()
    try:
        params = llm.params_for(fields)
        if check:
            check_prompts([ids], params, llm.arch, llm.token_ids)
        body.stops()
    except UnmaskError as e:
        raise APIError(400, str(e), param=e.param) from None
    return params


def infill(llm: LLM, body, ids: list[int], params: GenerationParams, specials: list[str]):
    """A completion's text after the hole (`suffix`) or its template (`template`): the prompt ids,
    the parameters, and what the engine takes (suffix, fill) plus the template (None without one),
    each checked for this model (a 400 names what is wrong)."""
    try:
        if body.template:
            prompt = body.prompt_value()
            if not isinstance(prompt, str):
                raise APIError(400, "template: the prompt must be text holding <|hole:N|> markers", param="prompt")
            if body.suffix is not None:
                raise APIError(400, "give a suffix or a template, not both (a template holds its text after the "
                                    "holes)", param="suffix")
            if body.stops():
                raise APIError(400, "stop strings do not apply to a template (each hole ends at its end of text)",
                               param="stop")
            check_text(prompt, specials, "prompt")
            t = holes.encode(llm.tokenizer, prompt, llm.token_ids.mask, params.gen_length)
            given, params = params, llm.template_params(params, t)
            check_prompts([t.prompt], params, llm.arch, llm.token_ids)
            if params.hole_length == "exact":
                check_suffix(t.suffix, params, llm.arch, llm.token_ids, len(t.prompt), llm.takes)
                return t.prompt, params, {"suffix": t.suffix, "fill": t.fill}, t
            for h in range(len(t.holes)):  # bounded holes decode one by one (server/completion.py)
                check_suffix(t.after(h), params, llm.arch, llm.token_ids, len(t.prompt), llm.takes)
            return t.prompt, params, {"suffix": t.suffix, "fill": t.fill, "rounds": given}, t
        if body.suffix is None:
            return ids, params, {}, None
        check_text(body.suffix, specials, "suffix")
        tail = llm.tokenizer.encode(body.suffix, add_special_tokens=False)
        unknown = llm.tokenizer.unknown_words(body.suffix)
        if unknown:
            raise UnmaskError(f"suffix: not in the vocabulary: {', '.join(map(repr, unknown[:8]))}", param="suffix")
        check_suffix(tail, params, llm.arch, llm.token_ids, len(ids), llm.takes)
        return ids, params, {"suffix": tail}, None
    except UnmaskError as e:
        raise APIError(400, str(e), param=e.param or ("prompt" if body.template else "suffix")) from None


async def grammar_for(engine, body, params: GenerationParams, holes: dict) -> object | None:
    """The request's structured output as the engine's grammar state (unmask.constrain.RowGrammar),
    made here so that a refusal (a schema the grammar engine rejects, a regex that matches nothing
    this vocabulary can write, no completion within max_tokens) is a 400 before anything streams;
    None without one. Built off the event loop (a large vocabulary takes a while the first time)."""
    constraint = body.constraint()
    if constraint is None:
        return None
    if body.stops():  # a stop string would cut the output outside its language
        raise APIError(400, "stop strings do not apply with structured output or a forced tool call: the output "
                            "must stay a word of its language (it ends where the grammar ends)", param="stop")
    make = getattr(engine.engine, "grammar", None)
    if make is None:
        raise APIError(400, "structured output is not supported under tensor parallelism yet", param="response_format")
    with_holes = bool(holes.get("suffix")) or holes.get("fill") is not None
    return await asyncio.to_thread(make, constraint, params, with_holes)


def logprobs_for(llm: LLM, body) -> int | None:
    """The request's logprobs (None, or the most likely tokens to report beside each chosen
    one), or a 400 where they are not reported."""
    k = body.logprob_count()
    if k is None:
        return None
    if getattr(body, "template", False):
        raise APIError(400, "logprobs are not reported for a template (its fixed text is not generated)",
                       param="logprobs")
    if llm.ranks is not None:
        raise APIError(400, "logprobs under tensor parallelism are not supported yet", param="logprobs")
    return k
