"""Benchmark grids: commit policy x knob x cache x refresh interval x block x gen length x batch.
Policy and cache names and what a policy's number means come from their registries."""

import itertools
from dataclasses import asdict, dataclass

from unmask.cache import CACHES
from unmask.errors import UnmaskError
from unmask.params import GenerationParams
from unmask.sampler.policy import POLICIES


def knob_names() -> dict[str, str]:
    """What the number in a grid entry `policy:VALUE` means, per policy."""
    return {name: cls.bench_knob for name, cls in POLICIES.items()}


@dataclass(frozen=True)
class BenchConfig:
    policy: str  # a commit policy, "ar" for the autoregressive twin, "dflash" for it with its drafter
    knob: float  # see knob_names(): fixed: tokens per step; threshold: tau; entropy: gamma; ...
    cache: str
    refresh_interval: int | None
    block_length: int
    gen_length: int
    batch: int
    # which model decodes it: "diffusion" (--model), "block" (--block-model, a block-diffusion model)
    # or, with policy "ar", the AR twin
    model: str = "diffusion"
    refresh_tokens: int | None = None  # the adaptive cache's triggers (grid entries adaptive:tN, adaptive:pC)
    refresh_below: float | None = None
    refresh_scope: str | None = None

    @property
    def label(self) -> str:
        if self.policy == "ar":
            return f"AR twin b{self.batch}"
        if self.policy == "dflash":
            return f"DFlash b{self.batch}"
        r = f" r{self.refresh_interval}" if self.refresh_interval else ""
        r += f" t{self.refresh_tokens}" if self.refresh_tokens else ""
        r += f" p{self.refresh_below:g}" if self.refresh_below else ""
        r += f" {self.refresh_scope}" if self.refresh_scope else ""
        who = "BD " if self.model == "block" else ""
        return f"{who}{self.policy}={self.knob:g} {self.cache}{r} blk{self.block_length} b{self.batch}"

    def params(self) -> GenerationParams:
        g = self.gen_length
        if self.policy in ("ar", "dflash"):  # the AR twin, alone or verifying a drafter's blocks
            return GenerationParams(gen_length=g, block_length=g)
        try:
            knob = POLICIES[self.policy].bench_params(self.knob, g)
        except ValueError as e:
            raise UnmaskError(str(e)) from None
        return GenerationParams(gen_length=g, block_length=self.block_length, cache=self.cache,
                                refresh_interval=self.refresh_interval, refresh_tokens=self.refresh_tokens,
                                refresh_below=self.refresh_below,
                                refresh_scope=self.refresh_scope, **knob).check()

    def key(self) -> dict:
        return asdict(self)


def parse_policies(text: str) -> list[tuple[str, float]]:
    """'fixed:1,threshold:0.9' -> [('fixed', 1.0), ('threshold', 0.9)]."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition(":")
        if name not in POLICIES:
            raise UnmaskError(f"unknown policy {name!r} in --policies; choose {', '.join(POLICIES)}")
        try:
            out.append((name, float(value) if value else 1.0))
        except ValueError:
            raise UnmaskError(f"--policies: {value!r} for {name} is not a number") from None
    if not out:
        raise UnmaskError(f"--policies {text!r} names no policy")
    return out


def split_cache(entry: str) -> tuple[str, dict]:
    """A --caches entry -> (cache, its own settings): 'dual' -> ('dual', {}); 'dual:r2' -> a
    refresh every 2 steps (instead of --refresh's intervals); the adaptive cache's triggers:
    'adaptive:t6' -> refresh_tokens 6, 'adaptive:p0.9' -> refresh_below 0.9, 'adaptive:t6:p0.9'
    both, 'adaptive' alone its default; 'canvas' or 'suffix' sets its refresh scope
    ('adaptive:p0.9:canvas')."""
    name, *parts = entry.split(":")
    if name not in CACHES:
        raise UnmaskError(f"unknown cache {name!r} in --caches; choose {', '.join(CACHES)}")
    knobs = CACHES[name].knobs
    letters = {letter: f for letter, (f, _) in ENTRY_KNOBS.items() if f in knobs}
    out = {}
    for t in parts:
        if "refresh_scope" in knobs and t in ("canvas", "suffix") and "refresh_scope" not in out:
            out["refresh_scope"] = t
            continue
        key = letters.get(t[:1])
        try:
            value = float(t[1:]) if key == "refresh_below" else int(t[1:])
        except ValueError:
            key = None
        if key is None or key in out or (key != "refresh_below" and value < 1):
            allowed = [text for letter, (f, text) in ENTRY_KNOBS.items() if f in knobs]
            allowed += ["canvas or suffix"] if "refresh_scope" in knobs else []
            raise UnmaskError(f"--caches {entry!r}: {t!r} is not a setting of cache {name}; it takes "
                              f"{', '.join(allowed) or 'nothing'}")
        out[key] = value
    return name, out


# the letters of a --caches entry's own settings: letter -> (GenerationParams field, what it means)
ENTRY_KNOBS = {"r": ("refresh_interval", "rN (refresh every N steps)"),
               "t": ("refresh_tokens", "tN (refresh after N committed tokens)"),
               "p": ("refresh_below", "pC (refresh a cached step that would commit below probability C)")}


def parse_caches(text: str) -> list[str]:
    """'none,dual,adaptive:p0.9' -> the entries, each checked (split_cache)."""
    out = [c.strip() for c in text.split(",") if c.strip()]
    for c in out:
        split_cache(c)
    if not out:
        raise UnmaskError(f"--caches {text!r} names no cache")
    return out


def parse_ints(flag: str, text: str, minimum: int = 1) -> list[int]:
    """'8,24' -> [8, 24], each at least `minimum`."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UnmaskError(f"--{flag} {text!r} is not a comma-separated list of integers") from None
    if not out or any(v < minimum for v in out):
        raise UnmaskError(f"--{flag} {text!r} needs integers >= {minimum}")
    return out


def build_grid(policies, caches, refresh, blocks, gens, batches, model: str = "diffusion") -> list[BenchConfig]:
    """The cartesian product, minus combinations that do not exist (a refresh interval without a
    cache; a block that does not tile the canvas). The first configuration of each batch size is
    the baseline that the others are compared with. Every setting is checked before anything runs."""
    grid = []
    for (policy, knob), entry, r, blk, g, b in itertools.product(policies, caches, refresh, blocks, gens, batches):
        cache, own = split_cache(entry)
        if ("refresh_interval" not in CACHES[cache].knobs and r) or (g % blk and model != "block"):
            continue
        if "refresh_interval" in own:  # the entry's own interval: once, not crossed with --refresh
            if r != refresh[0]:
                continue
            r = own.pop("refresh_interval")
        grid.append(BenchConfig(policy, knob, cache, r or None, blk, g, b, model, **own))
    if not grid:
        raise UnmaskError("the grid is empty: no block length tiles the generation length")
    for cfg in grid:
        cfg.params()
    return sorted(grid, key=lambda c: c.batch)


PRESETS = {
    # a few minutes on 2 cores: baseline, Fast-dLLM threshold with and without DualCache, EB-sampler
    "quick": dict(policies="fixed:1,threshold:0.9,entropy:0.5", caches="none,dual", refresh="0", blocks="24",
                  batches="1,8", n=24, tasks="copy,json,pairs,arith"),
    # under an hour: the full comparison reported in the README
    "full": dict(policies="fixed:1,fixed:2,fixed:4,threshold:0.9,threshold:0.7,threshold:0.5,factor:1,factor:2,"
                          "entropy:0.1,entropy:0.5,entropy:1,budget:1,budget:2",
                 caches="none,dual", refresh="0", blocks="8,24", batches="1,8", n=50, tasks=None),
}
