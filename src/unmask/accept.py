"""What a model accepts: the one function from (generation parameters, architecture) to the
parameters the model runs, checked, or an UnmaskError that names what it cannot take.

The Python API, the CLI, the server and the engine all go through `accept`; the results are
memoised, so a request that passes several of them is checked once.
- A causal model (the AR twin) decodes one token per forward with its exact KV cache: it takes
  AR_FIELDS; any other field set to something else than the reference setting is refused by
  name (a knob it would ignore must not look honoured). Its parameters become blocks of one
  token, the fixed schedule and cache "causal".
- A block-diffusion model (config bd_size) runs its blocks of bd_size positions: the rules of
  GenerationParams.check(block_size), and a cache that suits a block model.
- A full-attention model: GenerationParams.check() and a cache that suits it.
Reference modes (`compat`) are checked here too; only `LLM.generate` runs them (unmask.reference).
"""

from collections.abc import Iterable
from dataclasses import replace
from functools import lru_cache

from unmask.cache import CACHES
from unmask.errors import UnmaskError
from unmask.models.base import ArchConfig
from unmask.params import PARAM_FIELDS, RENOISE_COMPAT, RENOISE_KNOBS, SHAPE, GenerationParams

AR_FIELDS = ("gen_length", "temperature", "seed", "early_stop")  # what an autoregressive model honours
_REFERENCE = GenerationParams()
_AR = {"policy": "fixed", "cache": "causal", "refresh_interval": None, "remasking": "low_confidence", "confidence": "prob"}
_KIND_TEXT = {"full": "this model attends over the whole canvas",
              "block": "this block-diffusion model's finished blocks are cached exactly",
              "causal": "this causal model keeps an exact KV cache"}
_SUITS_TEXT = {("block",): "is exact only for block-diffusion models (config bd_size)",
               ("full",): "approximates a full-attention model's K/V",
               ("causal",): "is a causal model's exact KV cache (the AR twin's)"}


def _accept_renoising(params: GenerationParams, arch: ArchConfig, engine: bool) -> GenerationParams:
    """A renoising model (DiffusionGemma) runs its own sampler, natively (the engine) or as its
    reference's batch (compat diffusion-gemma): the same settings, checked by that mode, its
    defaults filled in; masked-diffusion settings are refused by name."""
    if params.compat not in (None, RENOISE_COMPAT):
        raise UnmaskError(f"compat {params.compat!r} reproduces a masked diffusion sampler; this {arch.family} model "
                          f"is a renoising model (its own sampler, or compat {RENOISE_COMPAT!r})", param="compat")
    if engine and params.compat is not None:
        raise UnmaskError(f"compat {params.compat!r} runs as its own batch (LLM.generate), not in the engine")
    try:
        checked = replace(params, compat=RENOISE_COMPAT).check()
    except UnmaskError as e:  # natively, name the model, not a mode the caller did not ask for
        if params.compat is not None:
            raise
        raise UnmaskError(str(e).replace(f"compat {RENOISE_COMPAT!r} does not support",
                                         f"this renoising {arch.family} model does not take"), param=e.param) from None
    return replace(checked, compat=params.compat)


def model_kind(arch: ArchConfig) -> str:
    return "causal" if arch.causal else "block" if arch.block_size else "full"


def accept(params: GenerationParams, arch: ArchConfig, given: Iterable[str] | None = None,
           engine: bool = False) -> GenerationParams:
    """`given`: the fields the caller set explicitly (CLI flags, request fields); without it, the
    fields that differ from the reference setting (the canvas shape aside). `engine`: the request
    engine runs it (a reference mode is refused)."""
    if not isinstance(params, GenerationParams):
        raise UnmaskError(f"params must be a GenerationParams or a dict of its fields, not {type(params).__name__}")
    return _accept(params, arch, None if given is None else frozenset(given), engine)


@lru_cache(maxsize=1024)
def _accept(params: GenerationParams, arch: ArchConfig, given: frozenset | None, engine: bool) -> GenerationParams:
    kind = model_kind(arch)
    if kind == "causal":
        if given is None:  # what differs from the reference setting and from what accept sets
            given = frozenset(f for f in PARAM_FIELDS if f not in SHAPE and getattr(params, f) != getattr(_REFERENCE, f)
                              and not (f in _AR and getattr(params, f) == _AR[f]))
        wrong = sorted(given - set(AR_FIELDS))
        if wrong:
            raise UnmaskError(f"{', '.join(wrong)}: not used by an autoregressive model (it decodes one token per "
                              f"forward with its KV cache); it takes {', '.join(AR_FIELDS)}", param=wrong[0])
        return replace(params, block_length=1, steps=params.gen_length, **_AR).check()
    if arch.canvas_length:
        return _accept_renoising(params, arch, engine)
    if params.compat == RENOISE_COMPAT:
        raise UnmaskError(f"compat {RENOISE_COMPAT!r} reproduces DiffusionGemma's generate; this is a {arch.family} "
                          "model", param="compat")
    for name in RENOISE_KNOBS:
        if getattr(params, name) is not None:
            raise UnmaskError(f"{name} {getattr(params, name)} is a setting of a renoising model's sampler "
                              f"(DiffusionGemma); this {arch.family} model is a masked diffusion model", param=name)
    if engine and params.compat is not None:
        raise UnmaskError(f"compat {params.compat!r} runs as its own batch (LLM.generate), not in the engine")
    p = params.check(arch.block_size)
    if p.compat is None:
        cache = CACHES.lookup(p.cache, UnmaskError)
        if kind not in cache.suits:
            fits = ", ".join(n for n, c in CACHES.items() if kind in c.suits)
            raise UnmaskError(f"cache {p.cache!r} {_SUITS_TEXT.get(cache.suits, 'does not suit this model')}; "
                              f"{_KIND_TEXT[kind]}: use {fits}")
    return p
