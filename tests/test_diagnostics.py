"""Commit-time diagnostics (issue 13, part 1): the observer sees every commit and changes none."""

import pytest

from unmask import GenerationParams
from unmask.engine.diagnostics import Observer

PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6, 5], [2, 7, 1], [8, 2, 8, 1, 8, 2]]


def _decode(llm, params, observer=None, reqs_out=None):
    engine = llm.engine()
    engine.observer = observer
    reqs = [engine.add_request(p, params) for p in PROMPTS]
    while engine.has_unfinished():
        engine.step()
    if reqs_out is not None:
        reqs_out += reqs
    return [r.canvas for r in reqs]


@pytest.mark.parametrize("fixture", ["llada", "dream"])
@pytest.mark.parametrize("kw", [dict(policy="threshold", threshold=0.3, cache="dual"),
                                dict(policy="fixed", cache="prefix"),
                                dict(policy="threshold", threshold=0.3, cache="dual", temperature=1.0, seed=3)])
def test_observing_does_not_change_the_decode(request, fixture, kw):
    llm = request.getfixturevalue(fixture)
    params = GenerationParams(gen_length=16, block_length=8, **kw).check()
    obs, reqs = Observer(), []
    assert _decode(llm, params, obs, reqs) == _decode(llm, params)
    assert len(obs.commits) == sum(sum(r.commits) for r in reqs)  # one record per committed token


def test_refresh_every_step_agrees_everywhere(llada):
    params = GenerationParams(gen_length=16, block_length=8, policy="threshold", threshold=0.3, cache="dual",
                              refresh_interval=1, early_stop=False).check()
    obs = Observer()
    _decode(llada, params, obs)
    assert len(obs.commits) == 16 * len(PROMPTS) and not obs.drift
    assert all(c.agree and c.cache_age == 0 and c.kl < 1e-5 for c in obs.commits)
    assert all(abs(c.cached_conf - c.fresh_conf) < 1e-5 for c in obs.commits)


def test_cached_steps_record_age_drift_and_positions(llada):
    params = GenerationParams(gen_length=24, block_length=8, policy="fixed", cache="dual", early_stop=False).check()
    obs = Observer()
    _decode(llada, params, obs)
    assert len(obs.commits) == 24 * len(PROMPTS)
    assert {c.cache_age for c in obs.commits} == set(range(8))  # one token per step: ages 0..7 in each block
    assert all(len(d.key_drift) == llada.arch.num_layers == len(d.value_drift) for d in obs.drift)
    assert all(v >= 0 for d in obs.drift for v in d.key_drift + d.value_drift)
    assert any(v > 0 for d in obs.drift for v in d.key_drift)  # the cached suffix is stale
    for c in obs.commits:
        assert c.position == 8 * c.block + c.in_block and 0 <= c.in_block < 8
        assert c.distance_to_open == -1 or 1 <= c.distance_to_open < 8
    assert obs.to_json()["commits"][0].keys() >= {"agree", "kl", "cache_age"}


def test_diagnose_command(capsys, tmp_path):
    import json

    from unmask.cli import main

    out = tmp_path / "diag.json"
    assert main(["diagnose", "--tasks", "copy,pairs", "--n", "4", "--block-length", "8", "--policy", "threshold",
                 "--cache", "dual", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["commits"] > 0 and 0 <= summary["disagreement"]["rate"] <= 1
    assert summary["disagreement_by_cache_age"]["0"]["rate"] == 0.0  # a full forward agrees with itself
    report = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert len(report["outcomes"]) == 8 and len(report["commits"]) == summary["commits"]
    assert main(["diagnose", "--model", "default-ar"]) == 2


def test_calibration_against_the_reference_decode(capsys):
    """Decoding with the reference setting itself, every committed token is the reference's: the
    reliability table's accuracy is 1 in every bin. With a cached parallel setting it is not."""
    import json

    from unmask.cli import main

    assert main(["diagnose", "--tasks", "copy,json", "--n", "8", "--policy", "fixed", "--steps", "24",
                 "--cache", "none"]) == 0
    cal = json.loads(capsys.readouterr().out)["calibration"]
    assert cal["reference"]["n"] > 0 and all(r["accuracy"] == 1.0 for r in cal["reference"]["reliability"])
    assert 0 <= cal["gold"]["ece"] <= 1
    assert main(["diagnose", "--tasks", "json,pairs", "--n", "16", "--policy", "threshold", "--threshold", "0.5",
                 "--block-length", "8", "--cache", "dual"]) == 0
    cal = json.loads(capsys.readouterr().out)["calibration"]
    assert any(r["accuracy"] < 1.0 for r in cal["reference"]["reliability"])
