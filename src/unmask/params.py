"""Per-request generation parameters: the one flat record of every decoding knob, assembled from
the components that read them.

Each component declares its own fields where it is defined (unmask.knobs.Knob: default, type,
help, range, whether a checkpoint may set it): a commit policy in its class's `fields`, a cache
policy in its class's, the proposal in ProposalConfig's, a compat mode in its own; the fields
below are the engine's (canvas shape, which components, seed, early stop). `GenerationParams` is
built from them, and from it the CLI flags, the lm-eval model arguments, the server's extra
fields, the benchmark grid and the setting key. `check()` rejects bad values with an
UnmaskError that names the parameter, the value and what is allowed.

Where values come from (`resolve_params`): what the caller gave, then the model's
generation_config.json, then unmask's fast defaults (FAST), then the fields' own defaults. The
fields' own defaults are the reference setting: one token per step, no cache.
"""

import types
import typing
from dataclasses import field, fields, make_dataclass

from unmask.cache import CACHES
from unmask.compat import COMPAT_MODES, get_mode
from unmask.errors import UnmaskError
from unmask.knobs import Knob, choices, merge, non_negative_int, positive_int
from unmask.sampler.policy import POLICIES
from unmask.sampler.proposal import ProposalConfig

SHAPE = ("gen_length", "block_length", "steps")


def _declared() -> dict[str, Knob]:
    """Every component's fields, in the order the CLI lists them: the canvas shape, the commit
    policy and its components' knobs, the proposal, the cache and its knobs, compat and its."""
    out = {
        "gen_length": Knob(128, int, "tokens to generate (the canvas length)", positive_int, from_model=True),
        "block_length": Knob(32, int, "denoising block length; gen_length must be a multiple", positive_int,
                             from_model=True),
        "steps": Knob(None, int, "fixed policy: total steps over all blocks (default: gen_length)", positive_int,
                      from_model=True),
        "policy": Knob("fixed", str, "commit policy", choices(POLICIES), from_model=True),
    }
    for name, cls in POLICIES.items():
        merge(out, cls.fields, f"policy {name}")
    merge(out, ProposalConfig.fields, "the proposal")
    out["seed"] = Knob(None, int, "random seed of a sampled or random-order decode")
    out["cache"] = Knob("none", str, "KV cache policy", choices(CACHES), from_model=True)
    for name, cls in CACHES.items():
        merge(out, cls.fields, f"cache {name}")
    out["compat"] = Knob(None, str, "reproduce a reference sampler token for token", choices(COMPAT_MODES))
    for name, mode in COMPAT_MODES.items():
        merge(out, mode.fields, f"compat {name}")
    out["early_stop"] = Knob(True, bool, "stop a row once its end of text is committed")
    out["hole_length"] = Knob(None, str, "a hole's length (text after it: a suffix): 'bound' (the default natively: "
                              "gen_length is the most it holds; the model's end of text, or its going on with the "
                              "suffix's own text, ends the middle), 'consensus' (the hole decoded at hole_candidates "
                              "lengths up to gen_length, the fill they agree on kept: engine/consensus.py), 'grow' (a "
                              "model with an expand token, DreamOn's: the hole starts at 4 masks, grows where the "
                              "model writes the expand token and ends at its end of text, up to gen_length) or "
                              "'exact' (gen_length tokens, as a reference sampler decodes it; the default of compat "
                              "modes)", choices(("bound", "grow", "exact", "consensus")), from_model=True)
    out["hole_candidates"] = Knob(10, int, "hole_length 'consensus': how many lengths the hole is decoded at (spread "
                                  "geometrically from an eighth of gen_length to gen_length)", positive_int,
                                  from_model=True)
    out["min_tokens"] = Knob(0, int, "tokens of the answer (or of a hole) before which no end-of-text token is "
                             "proposed (vLLM's and Mistral's min_tokens)", non_negative_int)
    return out


KNOBS = _declared()


class _Rules:
    """What GenerationParams does besides holding its fields (they are generated from KNOBS)."""

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
        if p.min_tokens > p.gen_length:
            raise UnmaskError(f"min_tokens {p.min_tokens} exceeds gen_length {p.gen_length}", param="min_tokens")
        if p.policy == "budget" and p.confidence == "neg_entropy":
            raise UnmaskError("policy budget needs a confidence in [0, 1]; confidence neg_entropy is not")
        if p.alg is not None and p.compat not in ("dream", "open-dcoder"):
            raise UnmaskError(f"alg {p.alg!r} is a Dream / Open-dCoder algorithm; use it with compat 'dream' or "
                              "'open-dcoder'")
        for name, owners in _MODE_KNOBS.items():  # a reference's own setting needs that reference
            value = getattr(p, name)
            if value != PARAM_FIELDS[name].default and p.compat not in owners and name != "alg":
                raise UnmaskError(f"{name} {value!r} is a setting of compat {' / '.join(owners)}", param=name)
        for name in RENOISE_KNOBS:
            if getattr(p, name) is not None and mode is not None and mode.name != RENOISE_COMPAT:
                raise UnmaskError(f"{name} {getattr(p, name)} is a setting of DiffusionGemma's sampler, not of "
                                  f"compat {p.compat!r}", param=name)
        if mode is not None:
            mode.check(p, subject)
        return p


GenerationParams = make_dataclass(
    "GenerationParams",
    [(name, k.type if k.default is not None else k.type | None,
      field(default=k.default, metadata={"help": k.help, "check": k.check})) for name, k in KNOBS.items()],
    bases=(_Rules,), frozen=True)
GenerationParams.__module__ = __name__  # pickled (Ray) and named as unmask.params.GenerationParams
GenerationParams.__doc__ = "Per-request generation parameters (fields: unmask.params.KNOBS)."

PARAM_FIELDS = {f.name: f for f in fields(GenerationParams)}
# the fields some cache policy reads (each cache declares its own in `fields`)
CACHE_KNOBS = tuple(dict.fromkeys(k for c in CACHES.values() for k in c.knobs))
# a knob that one cache alone reads names that cache, as a policy's knob names the policy
_CACHE_OF = {k: n for n, c in CACHES.items() for k in c.knobs
             if sum(k in other.knobs for other in CACHES.values()) == 1}
# the renoising sampler's settings (DiffusionGemma), declared by its mode, besides gamma, its entropy
# bound (the entropy policy's knob)
RENOISE_COMPAT = "diffusion-gemma"  # the reference loop a renoising model decodes with
RENOISE_KNOBS = tuple(get_mode(RENOISE_COMPAT).fields)
# the settings only some reference modes read (a renoising model's are its native sampler's too): name -> modes
_MODE_KNOBS = {k: tuple(n for n, m in COMPAT_MODES.items() if k in m.fields)
               for m in COMPAT_MODES.values() for k in m.fields if k not in RENOISE_KNOBS}
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


# what a model's generation_config.json may set (each field says; sampling knobs are the caller's)
MODEL_DEFAULT_KEYS = tuple(name for name, k in KNOBS.items() if k.from_model)
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
    the cross-field rules are left to the caller's `accept` (unmask.engine.accept), which runs them once
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
