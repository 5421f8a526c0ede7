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
    assert out.with_suffix(".calibration.png").stat().st_size > 10_000
    assert set(summary["signal_auc"]) >= {"cache_age", "tokens_since_refresh", "one_minus_cached_prob"}
    assert 0 < summary["tokens_per_forward"] <= 8
    cross = summary["by_cache_age_and_confidence"]
    assert sum(v["n"] for bins in cross.values() for v in bins.values()) == summary["commits"]
    assert all(v["rate"] == 0.0 and v["mean_confidence_shift"] < 1e-4 for v in cross["0"].values())
    assert len(report["outcomes"]) == 8 and len(report["commits"]) == summary["commits"]
    assert main(["diagnose", "--model", "default-ar"]) == 2


@pytest.mark.slow
def test_calibration_against_the_reference_decode(capsys):
    """Decoding with the reference setting itself, every committed token is the reference's: the
    reliability table's accuracy is 1 in every bin. With a cached parallel setting it is not."""
    import json

    from unmask.cli import main

    assert main(["diagnose", "--tasks", "copy,json", "--n", "8", "--policy", "fixed", "--steps", "24",
                 "--cache", "none"]) == 0
    cal = json.loads(capsys.readouterr().out)["calibration"]
    assert set(cal) == {"prob", "margin", "exp_neg_entropy"}
    for score in cal.values():
        assert score["reference"]["n"] > 0 and all(r["accuracy"] == 1.0 for r in score["reference"]["reliability"])
        assert score["reference"]["error_rate"] == 0.0
        assert 0 <= score["gold"]["ece"] <= 1 and 0 <= score["gold"]["error_rate"] <= 1
    assert main(["diagnose", "--tasks", "json,pairs", "--n", "16", "--policy", "threshold", "--threshold", "0.5",
                 "--block-length", "8", "--cache", "dual"]) == 0
    cal = json.loads(capsys.readouterr().out)["calibration"]
    assert any(r["accuracy"] < 1.0 for r in cal["prob"]["reference"]["reliability"])
    assert cal["prob"]["reference"]["error_rate"] > 0


def test_signal_auc_ranks_disagreements():
    """AUC 1 when a signal puts every disagreeing cached commit above every agreeing one, 0 when
    below, 0.5 when it cannot tell them apart (ties share their rank); exact commits are left out."""
    from unmask.bench.diagnose import signal_auc
    from unmask.engine.diagnostics import CommitRecord

    def rec(age, since, prob, agree):
        return CommitRecord("r", 0, age, 0, 1, 0, age, since, -1, prob, prob, prob, 0.1, agree, 0.0)

    commits = [rec(1, 2, 0.95, True), rec(1, 3, 0.9, True), rec(2, 1, 0.4, False), rec(2, 0, 0.3, False),
               rec(0, 0, 0.2, False)]  # the last is an exact commit (age 0): not counted
    auc = signal_auc(commits)
    assert auc["cached_commits"] == 4 and auc["disagreeing"] == 2
    assert auc["cache_age"] == 1.0 and auc["one_minus_cached_prob"] == 1.0 and auc["tokens_since_refresh"] == 0.0
    same = [rec(1, 1, 0.5, True), rec(1, 1, 0.5, False)]
    assert signal_auc(same)["cache_age"] == 0.5
