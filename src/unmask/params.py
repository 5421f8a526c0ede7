"""Per-request generation parameters: the one definition of every decoding knob.

Each field carries its help text and its range; the CLI flags, the lm-eval model arguments and
the benchmark grid are generated from these fields, and the policy / cache / compat names come
from their registries (unmask.sampler.policy, unmask.cache, unmask.compat). `check()`
rejects bad values with an UnmaskError that names the parameter, the value and what is allowed.

Where values come from (`resolve_params`): what the caller gave, then the model's
generation_config.json, then unmask's fast defaults (FAST), then the fields' own defaults. The
fields' own defaults are the reference setting: one token per step, no cache.
"""

import math
import types
import typing
from dataclasses import dataclass, field, fields

from unmask.cache import CACHES
from unmask.compat import COMPAT_MODES, DREAM_ALGS, get_mode
from unmask.errors import UnmaskError
from unmask.sampler.policy import POLICIES
from unmask.sampler.proposal import CONFIDENCES

REMASKING = ("low_confidence", "random")
CONFIDENCE_NAMES = tuple(c for c in CONFIDENCES if c != "random")  # "random" is what remasking=random uses


# A check takes (name, value) and returns None or the whole message, naming both.
def _positive_int(name: str, v) -> str | None:
    ok = isinstance(v, int) and not isinstance(v, bool) and v >= 1
    return None if ok else f"{name} {v!r} must be a positive integer"


def _non_negative_int(name: str, v) -> str | None:
    ok = isinstance(v, int) and not isinstance(v, bool) and v >= 0
    return None if ok else f"{name} {v!r} must be a non-negative integer"


def _interval(lo: float, hi: float, lo_open: bool = True, hi_open: bool = False):
    def check(name: str, v) -> str | None:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        ok = ok and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
        return None if ok else f"{name} {v!r} is outside {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    return check


def _choices(names):
    def check(name: str, v) -> str | None:
        return None if v in names else f"unknown {name} {v!r}; choose one of {', '.join(names)}"
    check.choices = names
    return check


def _param(default, help: str, check=None):
    return field(default=default, metadata={"help": help, "check": check})


@dataclass(frozen=True)
class GenerationParams:
    gen_length: int = _param(128, "tokens to generate (the canvas length)", _positive_int)
    block_length: int = _param(32, "denoising block length; gen_length must be a multiple", _positive_int)
    steps: int | None = _param(None, "fixed policy: total steps over all blocks (default: gen_length)", _positive_int)
    policy: str = _param("fixed", "commit policy", _choices(POLICIES))
    remasking: str = _param("low_confidence", "fixed policy's order: most confident first, or random",
                            _choices(REMASKING))
    confidence: str = _param("prob", "score that policies rank candidates by", _choices(CONFIDENCE_NAMES))
    threshold: float = _param(0.9, "threshold policy: commit every candidate with confidence >= this",
                              _interval(0, 1))
    factor: float = _param(1.0, "factor policy: f", _interval(0, math.inf, hi_open=True))
    gamma: float = _param(0.1, "entropy policy and compat diffusion-gemma: entropy bound (accept the lowest-entropy "
                          "positions while the sum of their entropies minus the largest is at most this)", _interval(0, math.inf, lo_open=False, hi_open=True))
    budget: float = _param(1.0, "budget policy: error budget f", _interval(0, math.inf, hi_open=True))
    cache: str = _param("none", "KV cache policy", _choices(CACHES))
    refresh_interval: int | None = _param(None, "also refresh the cache every N steps inside a block", _positive_int)
    refresh_tokens: int | None = _param(None, "adaptive cache: refresh once N tokens were committed since the cached "
                                        "K/V were computed", _positive_int)
    refresh_below: float | None = _param(None, "adaptive cache: a cached step that would commit a token with "
                                         "probability below this is recomputed (default 0.9)", _interval(0, 1))
    refresh_scope: str | None = _param(None, "adaptive cache: what a triggered refresh recomputes: suffix (the block "
                                       "and the masked suffix, default) or canvas (a full forward)",
                                       _choices(("suffix", "canvas")))
    temperature: float = _param(0.0, "sampling temperature (0: greedy)",
                                _interval(0, math.inf, lo_open=False, hi_open=True))
    top_k: int | None = _param(None, "sample among the k most likely tokens", _positive_int)
    top_p: float | None = _param(None, "sample from the smallest set with probability >= p", _interval(0, 1))
    seed: int | None = _param(None, "random seed of a sampled or random-order decode", None)
    edit_threshold: float | None = _param(None, "edit policy (and compat llada2): replace a committed token of the "
                                          "open block by the model's argmax when that differs with probability "
                                          "above this (token-to-token editing)", _interval(0, 1))
    max_post_steps: int = _param(16, "edit policy: editing steps a block may take after its last mask is committed",
                                 _non_negative_int)
    remask_eta: float | None = _param(None, "remdm policy: ReMDM's eta, the remasking probability bound (default 0.05)",
                                      _interval(0, 1))
    remask_strategy: str | None = _param(None, "remdm policy: how sigma is set: cap (default), rescale or conf",
                                         _choices(("cap", "rescale", "conf")))
    compat: str | None = _param(None, "reproduce a reference sampler token for token", _choices(COMPAT_MODES))
    alg: str | None = _param(None, "Dream algorithm, with compat dream", _choices(DREAM_ALGS))
    eps: float = _param(1e-3, "Dream's timestep floor, with compat dream", _interval(0, 1, hi_open=True))
    early_stop: bool = _param(True, "stop a row once its end of text is committed", None)
    t_max: float | None = _param(None, "compat diffusion-gemma: the temperature of a canvas's first denoising step "
                                 "(default 0.8); it falls linearly towards t_min", _interval(0, math.inf, hi_open=True))
    t_min: float | None = _param(None, "compat diffusion-gemma: the temperature the schedule falls to (default 0.4)",
                                 _interval(0, math.inf, lo_open=False, hi_open=True))
    max_denoising_steps: int | None = _param(None, "compat diffusion-gemma: denoising steps per canvas at most "
                                             "(default 48)", _positive_int)
    stability_threshold: int | None = _param(None, "compat diffusion-gemma: a canvas stops once its argmax stayed the "
                                             "same for this many steps (default 1) and it is confident",
                                             _non_negative_int)
    confidence_threshold: float | None = _param(None, "compat diffusion-gemma: ... confident: the mean entropy of its "
                                                "positions is below this (default 0.005)",
                                                _interval(0, math.inf, hi_open=True))

    def __post_init__(self) -> None:
        check_fields(self.__dict__)  # every value's type and range, as soon as it is built

    @property
    def total_steps(self) -> int:
        return self.gen_length if self.steps is None else self.steps

    @property
    def num_blocks(self) -> int:
        return -(-self.gen_length // self.block_length)  # a block model's canvas may end in a partial block

    @property
    def steps_per_block(self) -> int:
        return self.total_steps // self.num_blocks

    def resolved(self, mode=None) -> "GenerationParams":
        """Apply what a compat mode implies (e.g. Dream decodes the canvas as one block)."""
        mode = mode or (None if self.compat is None else get_mode(self.compat))
        return self if mode is None else mode.resolve(self)

    def check(self, block_size: int = 0, mode=None, subject: str | None = None) -> "GenerationParams":
        """Validate the rules between fields (each field was checked when built) and return the
        resolved parameters. `block_size`: the model's attention block when it is a
        block-diffusion model (its blocks are fixed by position, so the canvas need not tile).
        `mode`: the compat mode whose rules apply (by default `compat`'s), and `subject` who
        refuses what it cannot do (a renoising model's native sampler follows its reference's
        rules and refuses in its own name)."""
        mode = mode or (None if self.compat is None else get_mode(self.compat))
        p = self.resolved(mode)
        tiles = mode is None or mode.tiles
        if block_size and mode is None:
            if block_size % p.block_length:
                raise UnmaskError(f"block_length {p.block_length}: this block-diffusion model attends in blocks of "
                                  f"{block_size} positions (config bd_size); use block_length {block_size}, or a "
                                  "divisor of it to decode each block in left-to-right sub-blocks")
            if p.gen_length % p.total_steps:
                raise UnmaskError(f"steps {p.total_steps}: on a block-diffusion model the fixed schedule commits "
                                  f"gen_length / steps tokens per step, so steps must divide gen_length {p.gen_length}")
        elif tiles:
            if p.gen_length % p.block_length:
                raise UnmaskError(f"gen_length {p.gen_length} is not a multiple of block_length {p.block_length}")
            if p.total_steps % p.num_blocks:
                raise UnmaskError(f"steps {p.total_steps} is not a multiple of the number of blocks {p.num_blocks}")
        knobs = CACHES[p.cache].knobs
        for name in CACHE_KNOBS:  # a cache's settings are refused for a cache that does not read them
            if getattr(p, name) is not None and name not in knobs:
                takers = [n for n, c in CACHES.items() if name in c.knobs]
                raise UnmaskError(f"{name} {getattr(p, name)} is a setting of cache {', '.join(takers)}, "
                                  f"not of cache {p.cache}")
        if p.policy == "budget" and p.confidence == "neg_entropy":
            raise UnmaskError("policy budget needs a confidence in [0, 1]; confidence neg_entropy is not")
        if p.alg is not None and p.compat != "dream":
            raise UnmaskError(f"alg {p.alg!r} is a Dream algorithm; use it with compat 'dream'")
        for name in RENOISE_KNOBS:
            if getattr(p, name) is not None and mode is not None and mode.name != RENOISE_COMPAT:
                raise UnmaskError(f"{name} {getattr(p, name)} is a setting of DiffusionGemma's sampler, not of "
                                  f"compat {p.compat!r}", param=name)
        if mode is not None:
            mode.check(p, subject)
        return p


PARAM_FIELDS = {f.name: f for f in fields(GenerationParams)}
# the fields some cache policy reads (each cache names its own in `knobs`)
CACHE_KNOBS = tuple(dict.fromkeys(k for c in CACHES.values() for k in c.knobs))
# a knob that one cache alone reads names that cache, as a policy's knob names the policy
_CACHE_OF = {k: n for n, c in CACHES.items() for k in c.knobs
             if sum(k in other.knobs for other in CACHES.values()) == 1}
# the renoising sampler's settings (DiffusionGemma), besides gamma, its entropy bound
RENOISE_COMPAT = "diffusion-gemma"  # the reference loop a renoising model decodes with
# (its settings are declared once, by its mode: those a checkpoint gives, gamma aside, shared with the entropy policy)
RENOISE_KNOBS = tuple(k for k in get_mode(RENOISE_COMPAT).model_keys if k != "gamma")
# what differs between requests without changing how their rows are proposed and committed
_PER_REQUEST = ("gen_length", "steps", "seed")


def setting_key(p: GenerationParams) -> tuple:
    """Rows with equal keys share one proposal and one commit-policy call: every field but the
    per-request ones, whether the request has its own generator, and the total step count."""
    return tuple(getattr(p, f) for f in PARAM_FIELDS if f not in _PER_REQUEST) + (p.seed is not None, p.total_steps)


def field_type(f) -> type:
    """int / float / str / bool for a field, whether or not it may be None."""
    t = f.type
    if isinstance(t, types.UnionType) or typing.get_origin(t) is typing.Union:
        t = next(a for a in typing.get_args(t) if a is not type(None))
    return t


def _type_problem(f, value) -> str | None:
    t = field_type(f)
    if value is None:
        return None if f.default is None else f"{f.name} must not be None"
    if t is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif t is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, t)
    kind = "a number" if t is float else "an integer" if t is int else f"a {t.__name__}"
    return None if ok else f"{f.name} {value!r} must be {kind}"


def check_fields(values: dict) -> None:
    """Type and range of each value on its own (cross-field rules are GenerationParams.check's)."""
    for name, value in values.items():
        f = PARAM_FIELDS[name]
        problem = _type_problem(f, value)
        if problem is None and value is not None and f.metadata["check"] is not None:
            problem = f.metadata["check"](name, value)
        if problem:
            raise UnmaskError(problem)


def coerce(name: str, value, label: str | None = None):
    """A parameter value given as text (CLI, lm-eval model_args) converted to the field's type.
    `label` is how the caller names the parameter in an error (e.g. "--steps")."""
    f = PARAM_FIELDS[name]
    t = field_type(f)
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == "none" and f.default is None:
            return None
        try:
            if t is bool:
                if text.lower() not in ("true", "false", "1", "0"):
                    raise ValueError
                return text.lower() in ("true", "1")
            return t(text)
        except ValueError:
            kind = {int: "an integer", float: "a number", bool: "true or false"}.get(t, t.__name__)
            raise UnmaskError(f"{label or name} {value!r} is not {kind}") from None
    return value


SHAPE = ("gen_length", "block_length", "steps")
# what a model's generation_config.json may set besides the shape (sampling knobs are the caller's)
MODEL_DEFAULT_KEYS = SHAPE + ("policy", "remasking", "confidence", "threshold", "factor", "gamma", "budget",
                              "cache", *CACHE_KNOBS, *RENOISE_KNOBS)
# unmask's setting where a checkpoint recommends nothing: Fast-dLLM's threshold 0.9 with DualCache.
# On the embedded model it keeps the one-token-per-step accuracy with 4.7x fewer forwards (README,
# Results); Fast-dLLM reports the same on LLaDA-8B and Dream-7B (GSM8K within a point).
FAST = {"policy": "threshold", "threshold": 0.9, "cache": "dual"}


def renoise_defaults(g: dict) -> dict:
    """A renoising model's generation_config.json as GenerationParams fields: max_new_tokens is
    gen_length, sampler_config.entropy_bound gamma, the rest by their own names (null: not set)."""
    out = {k: g[k] for k in RENOISE_KNOBS if g.get(k) is not None}
    out["gen_length"] = g.get("max_new_tokens") or get_mode(RENOISE_COMPAT).DEFAULTS["gen_length"]
    out["block_length"] = out["gen_length"]  # no masked blocks: the canvas is the model's
    sampler = g.get("sampler_config")
    if isinstance(sampler, dict) and sampler.get("entropy_bound") is not None:
        out["gamma"] = sampler["entropy_bound"]
    elif sampler is not None:
        raise UnmaskError(f"sampler_config {sampler!r} must be an object with entropy_bound")
    return out


def canvas_shape(defaults: dict, given: dict, block_size: int = 0) -> dict:
    """gen_length / block_length / steps: what the user gave wins, then the model's generation
    defaults. A new gen_length alone means one token per step, and a single block when the
    default block does not tile it (not on a block-diffusion model, whose blocks are fixed by
    position). Keys left out take GenerationParams' defaults."""
    d = {k: v for k, v in defaults.items() if k in SHAPE}
    given = {k: v for k, v in given.items() if v is not None and k in SHAPE}
    if "gen_length" in given and "steps" not in given:
        d.pop("steps", None)
    if "gen_length" in given and "block_length" not in given and not block_size:
        if given["gen_length"] % d.get("block_length", GenerationParams.block_length):
            d["block_length"] = given["gen_length"]
    return {**d, **given}


def implied_policy(given: dict) -> str | None:
    """The policy that the knobs a caller gave imply (`--gamma 0.5` means the entropy policy;
    `--steps` or `--remasking` the fixed schedule), or None. Knobs of two policies are an error."""
    implied = {}
    for name, cls in POLICIES.items():
        for knob in cls.implied_by():
            if given.get(knob) is not None:
                implied.setdefault(name, knob)
    if len(implied) > 1:  # a knob another implied policy also reads implies only that one (threshold with edit)
        implied = {n: k for n, k in implied.items()
                   if not any(k in POLICIES[o].reads for o in implied if o != n)} or implied
    if len(implied) > 1:
        flags = " and ".join(f"{k} (policy {n})" for n, k in implied.items())
        raise UnmaskError(f"{flags} belong to different policies; name one with policy")
    return next(iter(implied), None)


def resolve_params(given: dict, model_defaults: dict | None = None, fast: bool = True,
                   block_size: int = 0, model_keys: tuple[str, ...] = (), check: bool = True) -> GenerationParams:
    """Checked GenerationParams from what the caller gave (None = not given), the model's
    generation defaults, and, when `fast`, unmask's fast defaults. A compat mode takes only the
    shape from the model (its reference defines the rest); so does `fast=False` (evaluation).
    `block_size`: the model's attention block, for a block-diffusion model. `model_keys`: fields
    always taken from the model's defaults (a renoising model's sampler settings). `check=False`:
    the cross-field rules are left to the caller's `accept` (unmask.accept), which runs them once
    for the model (each field is checked as it is built either way)."""
    given = {k: v for k, v in given.items() if v is not None}
    unknown = sorted(set(given) - set(PARAM_FIELDS))
    if unknown:
        raise UnmaskError(f"unknown generation parameter(s) {', '.join(unknown)}")
    check_fields(given)
    model_defaults = {k: v for k, v in (model_defaults or {}).items() if k in MODEL_DEFAULT_KEYS}
    values = canvas_shape(model_defaults, given, block_size)
    if "compat" in given:  # a reference's own settings may come from the checkpoint (DiffusionGemma's sampler)
        model_keys = model_keys + get_mode(given["compat"]).model_keys
    values.update({k: v for k, v in model_defaults.items() if k in model_keys})
    if fast and "compat" not in given:
        decoding = {**FAST, **{k: v for k, v in model_defaults.items() if k not in SHAPE}}
        if "policy" not in given:
            given["policy"] = implied_policy(given)
        named = {_CACHE_OF[k] for k, v in given.items() if v is not None and k in _CACHE_OF}
        if "cache" not in given and len(named) == 1:
            given["cache"] = named.pop()  # its own knobs name it (adaptive's triggers), as a policy's knob names the policy
        values = {**decoding, **values}
    values.update({k: v for k, v in given.items() if k not in SHAPE and v is not None})
    params = GenerationParams(**values)
    if check:
        params = params.check(block_size)
    _check_knobs_apply(given, params)
    return params


def _check_knobs_apply(given: dict, p: GenerationParams) -> None:
    """A knob the caller gave must be one the decode uses: `--gamma` with the threshold policy,
    or `--steps` with the entropy policy, would otherwise do nothing without a word."""
    if p.compat is not None:
        return  # a compat mode checks its own parameters
    for name, cls in POLICIES.items():
        if name == p.policy:
            continue
        own = set(cls.implied_by()) - set(POLICIES[p.policy].implied_by()) - set(POLICIES[p.policy].reads)
        for knob in sorted(own & {k for k, v in given.items() if v is not None}):
            if knob == "steps" and "gen_length" in given:
                continue
            raise UnmaskError(f"{knob} applies to policy {name}, not to policy {p.policy}")
