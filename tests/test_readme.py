"""The front page stays a front page and stays true: at most 150 lines, every relative link
resolves, and every figure of its results table is the one in its JSON."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_front_page_is_short_and_its_links_resolve():
    assert len(README.splitlines()) <= 150
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" in target:
                continue
            assert (doc.parent / target).exists(), f"{doc.name}: broken link {target}"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _signed(x: float) -> str:
    return f"{100 * x:+.1f}".replace("-", "−")


def _section(title: str) -> list[str]:
    """The README's lines under `## title`, up to the next section."""
    lines = README.splitlines()
    start = lines.index(f"## {title}")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start + 1 : end]


def test_results_table_matches_its_json():
    report = json.loads((ROOT / "benchmarks/results/splits/report.json").read_text())
    by_label = {r["label"]: r for r in report["results"]}
    rows = [line for line in _section("Results") if line.startswith("| ") and "|---" not in line][1:]
    assert len(rows) == 6
    labels = ["fixed=1 none blk8 b1", "threshold=0.9 dual blk24 b1", "AR twin b1",
              "fixed=1 none blk8 b8", "threshold=0.9 dual blk24 b8", "AR twin b8"]
    for line, label in zip(rows, labels):
        cells = [c.strip() for c in line.strip("|").split("|")]
        r = by_label[label]
        lo, hi = r["accuracy_ci95"]
        assert cells[1] == label.rsplit("b", 1)[1]
        assert cells[2] == f"{_pct(r['accuracy'])} % [{_pct(lo)}, {_pct(hi)}]", (label, cells[2])
        if "vs_baseline" in r:
            v = r["vs_baseline"]
            expect = f"{_signed(v['diff'])} [{_signed(v['ci95'][0])}, {_signed(v['ci95'][1])}]"
            assert cells[3] == expect, (label, cells[3], expect)
        else:
            assert cells[3] == "–"
        assert cells[4] == f"{r['nfe_per_request']:.1f}", (label, cells[4])
        assert cells[5] == f"{r['tokens_per_s']:.0f}", (label, cells[5])
    assert f"commit {report['context']['commit'][:7]}" in README


def test_results_json_was_made_with_the_defaults_the_code_has_now():
    """The front page's default row is today's default: the bench recorded the model's default
    parameters and linear kernel when it ran, and they are the ones the code gives now."""
    from unmask import LLM
    from unmask.models.loader import check_linear_kernel

    report = json.loads((ROOT / "benchmarks/results/splits/report.json").read_text())
    ctx, d = report["context"], LLM("default").default_params()
    assert ctx["linear_kernel"] == check_linear_kernel(None)
    assert ctx["defaults"] == {"policy": d.policy, "knob": d.threshold, "cache": d.cache,
                               "block_length": d.block_length, "gen_length": d.gen_length}
    shown = next(r for r in report["headline"] if r["role"] == "unmask best" and r["batch"] == 8)["config"]
    assert {k: shown[k] for k in ("policy", "knob", "cache", "block_length", "gen_length")} == ctx["defaults"]


def test_laptop_table_matches_its_json():
    """"Models that run on a laptop": each row as benchmarks/laptop_models.py renders it from its JSON."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import laptop_models
    finally:
        sys.path.pop(0)
    result = json.loads((ROOT / "benchmarks/results/laptop_models_cpu.json").read_text())
    rows = [line for line in _section("Models that run on a laptop") if line.startswith("| `")]
    assert rows == laptop_models.readme_rows(result)
    assert len(rows) == 6
