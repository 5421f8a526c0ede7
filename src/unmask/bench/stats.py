"""Statistics for honest comparisons: confidence intervals, paired tests, percentiles."""

import math
import random


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval for a proportion k / n."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def mcnemar_exact(a: list[bool], b: list[bool]) -> float:
    """Two-sided exact McNemar p-value for paired correctness flags of two systems."""
    if len(a) != len(b):
        raise ValueError("paired flags must have equal length")
    only_a = sum(1 for x, y in zip(a, b) if x and not y)
    only_b = sum(1 for x, y in zip(a, b) if y and not x)
    n = only_a + only_b
    if n == 0:
        return 1.0
    k = min(only_a, only_b)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired_bootstrap(a: list[bool] | list[float], b: list[bool] | list[float], iters: int = 2000,
                     seed: int = 0) -> tuple[float, float, float]:
    """Mean difference a - b (accuracy for flags, or any per-example score) with a 95 %
    paired-bootstrap interval (resampling examples)."""
    n = len(a)
    if n != len(b) or n == 0:
        raise ValueError("paired flags must have equal, non-zero length")
    diff = [float(x) - float(y) for x, y in zip(a, b)]
    rng = random.Random(seed)
    stats = sorted(sum(diff[rng.randrange(n)] for _ in range(n)) / n for _ in range(iters))
    return sum(diff) / n, stats[int(0.025 * iters)], stats[int(0.975 * iters) - 1]


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
