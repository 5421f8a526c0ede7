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
from unmask.compat import get_mode
from unmask.params import PARAM_FIELDS, RENOISE_COMPAT, RENOISE_KNOBS, SHAPE, GenerationParams

AR_FIELDS = ("gen_length", "temperature", "seed", "early_stop", "min_tokens")  # what an autoregressive model honours
# what a renoising model's sampler reads (DiffusionGemma's generate: whole canvases, its own schedule);
# policy "entropy" and temperature 0 are what it runs, so they may be named too
RENOISE_FIELDS = ("gen_length", "seed", "gamma", "compat", *RENOISE_KNOBS)
_RENOISE_SAME = {"policy": "entropy", "temperature": 0.0}
_REFERENCE = GenerationParams()
_AR = {"policy": "fixed", "cache": "causal", "refresh_interval": None, "remasking": "low_confidence", "confidence": "prob"}
_KIND_TEXT = {"full": "this model attends over the whole canvas",
              "block": "this block-diffusion model's finished blocks are cached exactly",
              "causal": "this causal model keeps an exact KV cache"}
_SUITS_TEXT = {("block",): "is exact only for block-diffusion models (config bd_size)",
               ("full",): "approximates a full-attention model's K/V",
               ("causal",): "is a causal model's exact KV cache (the AR twin's)"}


_RENOISE_HINT = {"temperature": " (its temperature falls from t_max to t_min)",
                 "steps": " (use max_denoising_steps, per canvas)"}


def refuse_unused_renoising(given: dict, arch: ArchConfig) -> None:
    """An UnmaskError naming the fields a renoising model's sampler would not use (None: not given)."""
    wrong = sorted(f for f, v in given.items() if v is not None and f not in RENOISE_FIELDS
                   and v != _RENOISE_SAME.get(f, object()))
    if wrong:
        shown = ", ".join(f"{f} {given[f]!r}" for f in wrong)
        raise UnmaskError(f"{shown}: not used by a renoising model{_RENOISE_HINT.get(wrong[0], '')}; this "
                          f"{arch.family} model rewrites whole canvases with its own sampler and takes "
                          f"{', '.join(RENOISE_FIELDS)}", param=wrong[0])


def _accept_renoising(params: GenerationParams, arch: ArchConfig, given: frozenset | None,
                      engine: bool) -> GenerationParams:
    """A renoising model (DiffusionGemma) runs its own sampler, natively (the engine) or as its
    reference's batch (compat diffusion-gemma): the same settings, checked by that mode, its
    defaults filled in; masked-diffusion settings (a policy, blocks, a cache...) are refused by
    name, given or not different from the reference setting."""
    if params.compat not in (None, RENOISE_COMPAT):
        raise UnmaskError(f"compat {params.compat!r} reproduces a masked diffusion sampler; this {arch.family} model "
                          f"is a renoising model (its own sampler, or compat {RENOISE_COMPAT!r})", param="compat")
    if given is None:  # what differs from the reference setting (a canvas-wide block is the canvas)
        given = frozenset(f for f in PARAM_FIELDS if getattr(params, f) != getattr(_REFERENCE, f)
                          and f not in ("gen_length", "steps")
                          and not (f == "block_length" and params.block_length == params.gen_length))
    refuse_unused_renoising({f: getattr(params, f) for f in given}, arch)
    if engine and params.compat is not None:
        raise UnmaskError(f"compat {params.compat!r} runs as its own batch (LLM.generate), not in the engine")
    # its sampler's rules are its reference's; natively they refuse in the model's name
    subject = None if params.compat is not None else f"this renoising {arch.family} model does not take"
    return params.check(mode=get_mode(RENOISE_COMPAT), subject=subject)


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
    kind = arch.kind
    if kind == "causal":
        if given is None:  # what differs from the reference setting and from what accept sets
            given = frozenset(f for f in PARAM_FIELDS if f not in SHAPE and getattr(params, f) != getattr(_REFERENCE, f)
                              and not (f in _AR and getattr(params, f) == _AR[f]))
        wrong = sorted(given - set(AR_FIELDS))
        if wrong:
            raise UnmaskError(f"{', '.join(wrong)}: not used by an autoregressive model (it decodes one token per "
                              f"forward with its KV cache); it takes {', '.join(AR_FIELDS)}", param=wrong[0])
        return replace(params, block_length=1, steps=params.gen_length, **_AR).check()
    if arch.kind == "renoise":
        return _accept_renoising(params, arch, given, engine)
    if params.compat is not None:  # the mode's family before its settings
        get_mode(params.compat).check_family(arch.family)
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
