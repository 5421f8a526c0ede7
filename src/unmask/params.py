"""Per-request generation parameters. Field names map one to one onto CLI flags and, later, the
HTTP request schema. `check()` rejects bad values with an UnmaskError that names them."""

from dataclasses import dataclass, replace

from unmask.errors import UnmaskError

POLICY_NAMES = ("fixed", "threshold", "factor", "entropy", "budget")
CACHE_NAMES = ("none", "prefix", "dual")
REMASKING = ("low_confidence", "random")
CONFIDENCE_NAMES = ("prob", "margin", "neg_entropy")
COMPAT_NAMES = ("fast-dllm", "llada", "dream")
DREAM_ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")


SHAPE = ("gen_length", "block_length", "steps")


def canvas_shape(defaults: dict, given: dict) -> dict:
    """gen_length / block_length / steps: what the user gave wins, then the model's generation
    defaults. A new gen_length alone means one token per step, and a single block when the
    default block does not tile it. Keys left out take GenerationParams' defaults."""
    d = {k: v for k, v in defaults.items() if k in SHAPE}
    given = {k: v for k, v in given.items() if v is not None}
    if "gen_length" in given and "steps" not in given:
        d.pop("steps", None)
    if "gen_length" in given and "block_length" not in given:
        if given["gen_length"] % d.get("block_length", GenerationParams.block_length):
            d["block_length"] = given["gen_length"]
    return {**d, **given}


@dataclass(frozen=True)
class GenerationParams:
    gen_length: int = 128
    block_length: int = 32
    steps: int | None = None  # total forwards budget of the fixed schedule; None = gen_length
    policy: str = "fixed"
    remasking: str = "low_confidence"  # fixed-policy order: confidence or random
    confidence: str = "prob"  # score used for ranking: prob | margin | neg_entropy
    threshold: float = 0.9
    factor: float = 1.0
    gamma: float = 0.1
    budget: float = 1.0
    cache: str = "none"
    refresh_interval: int | None = None
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    compat: str | None = None
    alg: str | None = None  # Dream algorithm, only with compat="dream"
    eps: float = 1e-3  # Dream timestep floor, only with compat="dream"
    early_stop: bool = True

    @property
    def total_steps(self) -> int:
        return self.gen_length if self.steps is None else self.steps

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    @property
    def steps_per_block(self) -> int:
        return self.total_steps // self.num_blocks

    def resolved(self) -> "GenerationParams":
        """Apply what a compat mode implies (Dream decodes the canvas as one block; reference
        samplers never stop early)."""
        p = self
        if p.compat == "dream":
            p = replace(p, block_length=p.gen_length, alg=p.alg or "origin")
        if p.compat is not None:
            p = replace(p, early_stop=False)
        return p

    def check(self) -> "GenerationParams":
        """Validate and return the resolved parameters."""
        _choice("policy", self.policy, POLICY_NAMES)
        _choice("cache", self.cache, CACHE_NAMES)
        _choice("remasking", self.remasking, REMASKING)
        _choice("confidence", self.confidence, CONFIDENCE_NAMES)
        if self.compat is not None:
            _choice("compat", self.compat, COMPAT_NAMES)
        p = self.resolved()
        _positive_int("gen_length", p.gen_length)
        _positive_int("block_length", p.block_length)
        if p.gen_length % p.block_length:
            raise UnmaskError(f"gen_length {p.gen_length} is not a multiple of block_length {p.block_length}")
        _positive_int("steps", p.total_steps)
        if p.total_steps % p.num_blocks:
            raise UnmaskError(f"steps {p.total_steps} is not a multiple of the number of blocks {p.num_blocks}")
        if not (0 < p.threshold <= 1):
            raise UnmaskError(f"threshold {p.threshold} is outside (0, 1]")
        for name in ("factor", "budget"):
            if not getattr(p, name) > 0:
                raise UnmaskError(f"{name} {getattr(p, name)} must be > 0")
        if not p.gamma >= 0:
            raise UnmaskError(f"gamma {p.gamma} must be >= 0")
        if p.refresh_interval is not None:
            _positive_int("refresh_interval", p.refresh_interval)
        if not p.temperature >= 0:
            raise UnmaskError(f"temperature {p.temperature} must be >= 0")
        if p.top_k is not None:
            _positive_int("top_k", p.top_k)
        if p.top_p is not None and not (0 < p.top_p <= 1):
            raise UnmaskError(f"top_p {p.top_p} is outside (0, 1]")
        if p.policy == "budget" and p.confidence == "neg_entropy":
            raise UnmaskError("policy budget needs a confidence in [0, 1]; confidence neg_entropy is not")
        if p.alg is not None and p.compat != "dream":
            raise UnmaskError(f"alg {p.alg!r} is a Dream algorithm; use it with compat 'dream'")
        if p.compat is not None:
            _check_compat(p)
        return p


def _check_compat(p: GenerationParams) -> None:
    def need(cond: bool, what: str) -> None:
        if not cond:
            raise UnmaskError(f"compat {p.compat!r} does not support {what}")

    need(p.refresh_interval is None, f"refresh_interval {p.refresh_interval}")
    need(p.top_k is None and p.top_p is None or p.compat == "dream", "top_k / top_p")
    need(p.confidence == "prob", f"confidence {p.confidence!r}")
    if p.compat == "fast-dllm":
        need(p.policy in ("fixed", "threshold", "factor"), f"policy {p.policy!r}")
    elif p.compat == "llada":
        need(p.policy == "fixed", f"policy {p.policy!r}")
        need(p.cache == "none", f"cache {p.cache!r}")
    else:
        _choice("alg", p.alg, DREAM_ALGS)
        need(p.policy == "fixed", f"policy {p.policy!r} (choose the algorithm with alg)")
        need(p.cache == "none", f"cache {p.cache!r}")
        need(p.remasking == "low_confidence", f"remasking {p.remasking!r}")


def _choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise UnmaskError(f"unknown {name} {value!r}; choose one of {', '.join(allowed)}")


def _positive_int(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UnmaskError(f"{name} {value!r} must be a positive integer")
