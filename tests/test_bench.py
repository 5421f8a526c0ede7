"""`unmask bench --quick` end to end on tiny models: valid JSON, a PNG, and sane numbers."""

import json

import pytest

from unmask.cli import main
from unmask.train.run import train
from unmask.train.trainer import TrainConfig

TINY = dict(layers=1, d_model=32, heads=2, mlp=64, gen_length=24, batch=4, eval_every=100)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench_models")
    train(TrainConfig(steps=2, **TINY), root / "d", progress=False)
    train(TrainConfig(kind="ar", steps=2, **TINY), root / "a", progress=False)
    return root / "d" / "model", root / "a" / "model"


def test_bench_measures_a_block_model_beside_the_others(tmp_path, tiny_models):
    d, a = tiny_models
    train(TrainConfig(kind="block", block_length=8, steps=2, **TINY), tmp_path / "b", progress=False)
    code = main(["bench", "--model", str(d), "--ar-model", str(a), "--block-model", str(tmp_path / "b" / "model"),
                 "--policies", "fixed:1,threshold:0.9", "--caches", "none", "--blocks", "24", "--batches", "1",
                 "--n", "3", "--tasks", "copy", "--out", str(tmp_path / "out"), "--quiet"])
    assert code == 0
    run = json.loads(next((tmp_path / "out").glob("*.json")).read_text())
    rows = run["results"]
    block = [r for r in rows if r["config"]["model"] == "block"]
    assert [r["label"] for r in block] == ["BD fixed=1 exact blk8 b1", "BD threshold=0.9 exact blk8 b1"]
    assert all("vs_baseline" in r and r["n"] == 3 for r in block)  # paired against the same examples
    assert {"block baseline", "block best"} <= {h["role"] for h in run["headline"]}
    assert run["block_model"].endswith("model")
    assert main(["bench", "--block-model", str(d), "--n", "1", "--out", str(tmp_path / "x")]) == 2


def test_quick_bench_writes_json_and_png(tmp_path, tiny_models, capsys):
    d, a = tiny_models
    code = main(["bench", "--quick", "--model", str(d), "--ar-model", str(a), "--n", "4", "--tasks", "copy,pairs",
                 "--out", str(tmp_path), "--quiet"])
    assert code == 0
    files = sorted(tmp_path.iterdir())
    run = json.loads(next(f for f in files if f.suffix == ".json").read_text())
    png = next(f for f in files if f.suffix == ".png")
    assert png.stat().st_size > 5000
    labels = [r["label"] for r in run["results"]]
    assert any(lab.startswith("AR twin") for lab in labels)
    # 3 policies x 2 caches x 2 batches + AR at 2 batches
    assert len(run["results"]) == 14
    for r in run["results"]:
        assert r["n"] == 8 and 0 <= r["accuracy"] <= 1
        assert r["tokens_per_s"] > 0 and r["latency_ms"]["p50"] <= r["latency_ms"]["p95"] <= r["latency_ms"]["p99"]
        assert r["predicted_seconds"] > 0
    base = run["results"][0]
    assert "vs_baseline" not in base and "vs_baseline" in run["results"][1]
    dual = next(r for r in run["results"] if r["config"]["cache"] == "dual" and r["config"]["batch"] == 1)
    assert dual["G"] < base["G"]  # dual cache recomputes fewer positions per forward
    assert run["context"]["timer_includes"] and run["context"]["torch"]
    assert {h["role"] for h in run["headline"]} >= {"baseline", "unmask best", "AR twin"}
    out = capsys.readouterr().out
    assert "configuration" in out and "unmask best" in out


def _row(policy, batch, acc, tps, cache="none"):
    return {"config": {"policy": policy, "batch": batch, "cache": cache}, "label": f"{policy} {cache} b{batch}",
            "accuracy": acc, "nfe_per_request": 1.0, "tokens_per_s": tps}


def test_headline_picks_fastest_within_one_point_of_the_baseline():
    from unmask.bench.report import headline

    run = {"results": [
        _row("fixed", 1, 0.50, 10), _row("threshold", 1, 0.495, 50, "dual"), _row("threshold", 1, 0.48, 90),
        _row("entropy", 1, 0.51, 70), _row("budget", 1, 0.30, 500), _row("ar", 1, 0.6, 40),
        _row("fixed", 8, 0.50, 30), _row("factor", 8, 0.42, 300)]}
    picks = {(h["batch"], h["role"]): h for h in headline(run)}
    assert picks[1, "baseline"]["label"] == "fixed none b1"
    assert picks[1, "Fast-dLLM best"]["label"] == "threshold dual b1"  # 0.48 is 2 points below
    assert picks[1, "unmask best"]["label"] == "entropy none b1" and picks[1, "unmask best"]["speedup_vs_baseline"] == 7
    assert picks[1, "AR twin"]["accuracy"] == 0.6
    assert (8, "Fast-dLLM best") not in picks and picks[8, "unmask best"]["label"] == "fixed none b8"


def test_bench_rejects_bad_grid(capsys):
    assert main(["bench", "--policies", "greedy:1"]) == 2
    assert "unknown policy 'greedy'" in capsys.readouterr().err


def test_bench_compares_refresh_rules(tmp_path, tiny_models):
    """Cache entries carry their own settings (a refresh interval, the adaptive cache's triggers);
    the run reports positions recomputed per request and draws the refresh-rule plot."""
    d, _ = tiny_models
    code = main(["bench", "--model", str(d), "--ar-model", "none", "--policies", "threshold:0.9",
                 "--caches", "none,dual,dual:r2,adaptive:p0.9,adaptive:t2:canvas", "--blocks", "8", "--batches", "1",
                 "--n", "3", "--tasks", "copy", "--out", str(tmp_path), "--quiet"])
    assert code == 0
    run = json.loads(next(tmp_path.glob("*.json")).read_text())
    rows = {r["label"]: r for r in run["results"]}
    assert list(rows) == ["threshold=0.9 none blk8 b1", "threshold=0.9 dual blk8 b1", "threshold=0.9 dual r2 blk8 b1",
                          "threshold=0.9 adaptive p0.9 blk8 b1", "threshold=0.9 adaptive t2 canvas blk8 b1"]
    none, dual = rows["threshold=0.9 none blk8 b1"], rows["threshold=0.9 dual blk8 b1"]
    assert dual["positions_per_request"] < none["positions_per_request"]
    assert rows["threshold=0.9 dual r2 blk8 b1"]["config"]["refresh_interval"] == 2
    assert rows["threshold=0.9 adaptive p0.9 blk8 b1"]["config"]["refresh_below"] == 0.9
    assert next(tmp_path.glob("*.caches.png")).stat().st_size > 5000


@pytest.mark.parametrize("entry, message", [
    ("dual:t3", "'t3' is not a setting of cache dual"), ("none:r2", "'r2' is not a setting of cache none"),
    ("adaptive:t0", "'t0' is not a setting of cache adaptive"), ("adaptive:p2", "refresh_below 2.0 is outside"),
    ("adaptive:q1", "'q1' is not a setting"),
])
def test_bench_names_a_bad_cache_entry(capsys, tmp_path, entry, message):
    assert main(["bench", "--caches", entry, "--n", "1", "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err


def test_splits_are_disjoint_and_never_trained_on():
    from itertools import islice

    from unmask.tasks import SPLITS, TASKS, split_examples, train_stream

    assert SPLITS == {"selection": (0, 250), "report": (250, 1000)}
    for task in TASKS:
        sel, rep = split_examples(task, "selection"), split_examples(task, "report")
        assert (len(sel), len(rep)) == (250, 750)
        assert not {e.prompt for e in sel} & {e.prompt for e in rep}
        assert split_examples(task, "report", 5) == rep[:5]
        trained = {e.prompt for e in islice(train_stream(task, seed=0), 3000)}
        assert not trained & {e.prompt for e in rep}
    with pytest.raises(ValueError, match="holds 250 examples"):
        split_examples("copy", "selection", 251)


def test_a_report_run_measures_the_selection_runs_picks_on_other_examples(tmp_path, tiny_models, capsys):
    """Choose on one split, report on the other: the report run chooses nothing, it measures the
    selection run's picks (with --batches, at other batch sizes too) and says whether they hold."""
    d, a = tiny_models
    common = ["--model", str(d), "--ar-model", str(a), "--n", "3", "--tasks", "copy", "--quiet"]
    assert main(["bench", *common, "--policies", "fixed:1,threshold:0.9,budget:2", "--caches", "none,dual",
                 "--blocks", "24", "--batches", "2", "--tolerance", "0.5", "--out", str(tmp_path / "sel")]) == 0
    sel_path = next((tmp_path / "sel").glob("*.json"))
    sel = json.loads(sel_path.read_text())
    assert sel["split"] == "selection" and sel["tolerance"] == 0.005 and "examples 0-2" in sel["examples"]
    capsys.readouterr()
    assert main(["bench", *common, "--split", "report", "--chosen", str(sel_path), "--batches", "1,2",
                 "--out", str(tmp_path / "rep")]) == 0
    rep = json.loads(next((tmp_path / "rep").glob("*.json")).read_text())
    assert rep["split"] == "report" and "examples 250-252" in rep["examples"]
    picked = {(h["role"], h["label"].rsplit(" b", 1)[0]) for h in sel["headline"]}
    for batch in (1, 2):
        got = {(h["role"], h["label"].rsplit(" b", 1)[0]) for h in rep["headline"] if h["batch"] == batch}
        assert got == picked
    measured = {r["label"].rsplit(" b", 1)[0] for r in rep["results"]}
    assert measured == {label for _, label in picked}  # nothing else was measured, nothing re-picked
    for h in rep["headline"]:
        if h["role"] not in ("baseline", "AR twin"):
            assert isinstance(h["holds"], bool) and isinstance(h["shown"], bool)
    assert "measured on the report split" in capsys.readouterr().out
    # refused by name: reporting on the split it was chosen on, choosing again, a file that is no run
    assert main(["bench", *common, "--chosen", str(sel_path), "--out", str(tmp_path / "x")]) == 2
    assert "not on the examples they were chosen on" in capsys.readouterr().err
    assert main(["bench", *common, "--split", "report", "--chosen", str(sel_path), "--policies", "fixed:1",
                 "--out", str(tmp_path / "x")]) == 2
    assert "would choose again" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{}")
    assert main(["bench", *common, "--split", "report", "--chosen", str(tmp_path / "bad.json"),
                 "--out", str(tmp_path / "x")]) == 2
    assert "not a finished `unmask bench` run" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_non_inferiority_rule_and_choosing_again_from_a_finished_run(tmp_path, tiny_models, capsys):
    """--rule ci keeps a configuration only if its paired interval against the baseline excludes a
    loss larger than the tolerance; --headline-of chooses again from the recorded per-example
    results without measuring."""
    from unmask.bench.report import headline

    d, _ = tiny_models
    assert main(["bench", "--model", str(d), "--ar-model", "none", "--policies", "fixed:1,threshold:0.9,budget:4",
                 "--caches", "none", "--blocks", "24", "--batches", "1", "--n", "4", "--tasks", "copy,sort",
                 "--out", str(tmp_path), "--quiet"]) == 0
    path = next(tmp_path.glob("*.json"))
    run = json.loads(path.read_text())
    assert all(len(r["flags"]["copy"]) == 4 and set(r["flags"]["copy"]) <= {"0", "1"} for r in run["results"])
    point = {h["role"]: h["label"] for h in headline(run, 0.5, "point")}
    strict = {h["role"]: h["label"] for h in headline(run, 0.0, "ci")}
    base = run["results"][0]
    for r in run["results"][1:]:  # with tolerance 0, ci keeps only rows never worse on any resample
        lo = r["vs_baseline"]["ci95"][0]
        if r["label"] == strict["unmask best"]:
            assert lo >= 0
    assert point["baseline"] == strict["baseline"] == base["label"]
    capsys.readouterr()
    assert main(["bench", "--headline-of", str(path), "--rule", "ci", "--tolerance", "0"]) == 0
    again = json.loads(path.read_text())
    assert again["rule"] == "ci" and {h["role"]: h["label"] for h in again["headline"]} == strict
    assert main(["bench", "--headline-of", str(tmp_path / "missing.json")]) == 2
