"""Metric code on crafted inputs."""

import pytest

from unmask.bench.stats import mcnemar_exact, paired_bootstrap, percentile, wilson_interval
from unmask.tasks import Example, score


def test_wilson_interval_known_values():
    lo, hi = wilson_interval(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-4) and hi == pytest.approx(0.5962, abs=1e-4)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == pytest.approx(1.0)


def test_mcnemar_exact():
    a = [True] * 10 + [False] * 10
    assert mcnemar_exact(a, a) == 1.0
    # 8 discordant pairs all favouring a: p = 2 * 0.5^8
    b = [False] * 8 + [True] * 2 + [False] * 10
    assert mcnemar_exact(a, b) == pytest.approx(2 / 256)
    with pytest.raises(ValueError):
        mcnemar_exact([True], [True, False])


def test_paired_bootstrap_contains_the_difference():
    a = [True] * 70 + [False] * 30
    b = [True] * 60 + [False] * 40
    d, lo, hi = paired_bootstrap(a, b, iters=1000)
    assert d == pytest.approx(0.10) and lo <= 0.10 <= hi and lo >= 0


def test_percentiles_match_numpy_linear():
    import numpy as np

    xs = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0]
    for q in (50, 95, 99):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_tokens_up_to_end_of_text():
    from unmask.llm import GenerationResult

    r = GenerationResult("a b", [5, 6], [5, 6, 1, 1, 1, 1], "stop", nfe=2, commits=[4, 2])
    assert r.tokens_per_forward == pytest.approx(3 / 2)  # two tokens and the end of text, not the padding
    assert score(Example("copy", "copy : a b", "a b"), "a b").exact
