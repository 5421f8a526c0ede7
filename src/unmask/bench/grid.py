"""Benchmark grids: commit policy x knob x cache x refresh interval x block x gen length x batch."""

import itertools
from dataclasses import asdict, dataclass

from unmask.errors import UnmaskError
from unmask.params import GenerationParams

KNOB = {"fixed": "tokens per step", "threshold": "threshold", "factor": "factor", "entropy": "gamma", "budget": "budget"}


@dataclass(frozen=True)
class BenchConfig:
    policy: str  # a commit policy, or "ar" for the autoregressive twin
    knob: float  # fixed: tokens per step; threshold: tau; factor: f; entropy: gamma; budget: f
    cache: str
    refresh_interval: int | None
    block_length: int
    gen_length: int
    batch: int

    @property
    def label(self) -> str:
        if self.policy == "ar":
            return f"AR twin b{self.batch}"
        r = f" r{self.refresh_interval}" if self.refresh_interval else ""
        return f"{self.policy}={self.knob:g} {self.cache}{r} blk{self.block_length} b{self.batch}"

    def params(self) -> GenerationParams:
        g = self.gen_length
        kw = dict(gen_length=g, block_length=self.block_length, cache=self.cache, refresh_interval=self.refresh_interval)
        if self.policy == "ar":
            return GenerationParams(gen_length=g, block_length=g)
        if self.policy == "fixed":
            k = int(self.knob)
            if k < 1 or g % k:
                raise UnmaskError(f"fixed:{self.knob:g}: tokens per step must divide gen_length {g}")
            return GenerationParams(steps=g // k, policy="fixed", **kw).check()
        name = {"threshold": "threshold", "factor": "factor", "entropy": "gamma", "budget": "budget"}[self.policy]
        return GenerationParams(policy=self.policy, **{name: self.knob}, **kw).check()

    def key(self) -> dict:
        return asdict(self)


def parse_policies(text: str) -> list[tuple[str, float]]:
    """'fixed:1,threshold:0.9' -> [('fixed', 1.0), ('threshold', 0.9)]."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition(":")
        if name not in KNOB:
            raise UnmaskError(f"unknown policy {name!r} in --policies; choose {', '.join(KNOB)}")
        try:
            out.append((name, float(value) if value else 1.0))
        except ValueError:
            raise UnmaskError(f"--policies: {value!r} for {name} is not a number") from None
    return out


def build_grid(policies, caches, refresh, blocks, gens, batches) -> list[BenchConfig]:
    """The cartesian product, minus combinations that do not exist (a refresh interval without a
    cache; a block that does not tile the canvas). The first configuration of each batch size is
    the baseline that the others are compared with."""
    grid = []
    for (policy, knob), cache, r, blk, g, b in itertools.product(policies, caches, refresh, blocks, gens, batches):
        if (cache == "none" and r) or g % blk:
            continue
        grid.append(BenchConfig(policy, knob, cache, r or None, blk, g, b))
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
