"""Every command's file arguments (hypothesis): a folder where a file is expected and the reverse, a
path inside a file, a place where nothing can be created, an empty path, or a good path. Each
outcome is a result (exit 0) or one clean line (exit 2) naming the flag; an error leaves the
folder exactly as it was, and a success leaves no temporary or probe file behind."""

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unmask.cli import main

TINY_TRAIN = ["--steps", "1", "--layers", "1", "--d-model", "32", "--heads", "2", "--mlp", "32", "--batch", "2",
              "--gen-length", "24", "--quiet", "--eval-every", "100"]
QUICK_BENCH = ["--ar-model", "none", "--n", "1", "--tasks", "copy", "--policies", "fixed:1", "--caches", "none",
               "--blocks", "8", "--batches", "1", "--quiet"]

# (command line with {} for the path, what the path must be)
COMMANDS = {
    "generate --model": (["generate", "--prompt-ids", "1,2", "--gen-length", "8", "--block-length", "8", "--model", "{}"],
                         "folder"),
    "eval --model": (["eval", "--n", "1", "--tasks", "copy", "--model", "{}"], "folder"),
    "gsm8k --data": (["gsm8k", "--n", "1", "--gen-length", "8", "--block-length", "8", "--data", "{}"], "folder"),
    "train --init-from": (["train", "--out", "run", *TINY_TRAIN, "--init-from", "{}"], "folder"),
    "train --out": (["train", *TINY_TRAIN, "--out", "{}"], "new folder"),
    "bench --out": (["bench", *QUICK_BENCH, "--out", "{}"], "new folder"),
    "diagnose --out": (["diagnose", "--n", "1", "--tasks", "copy", "--batch-size", "1", "--out", "{}"], "file"),
    "roofline --plot": (["roofline", "--hardware", "h200", "--batches", "1,8", "--plot", "{}"], "figure"),
    "roofline --model": (["roofline", "--model", "{}"], "folder"),
}
KINDS = ["existing folder", "existing file", "inside a file", "nowhere", "empty", "new", "new nested", "dot"]
LEFTOVERS = (".tmp-", ".unmask-probe-", ".write-test")


def _path_for(kind: str, want: str, root: Path) -> str:
    (root / "adir").mkdir()
    (root / "afile").write_text("x")
    ext = {"file": ".json", "figure": ".png"}.get(want, "")
    return {
        "existing folder": "adir",
        "existing file": "afile",
        "inside a file": "afile/x" + ext,
        "nowhere": "/proc/unmask-nowhere/x" + ext,  # nothing can be created under /proc, even as root
        "empty": "",
        "new": "fresh" + ext,
        "new nested": "a/b/fresh" + ext,
        "dot": ".",
    }[kind]


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in root.rglob("*")}


@settings(max_examples=45, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(sorted(COMMANDS)), kind=st.sampled_from(KINDS))
def test_file_arguments_give_a_result_or_a_clean_error(tmp_path_factory, capsys, command, kind):
    argv, want = COMMANDS[command]
    root = tmp_path_factory.mktemp("files")
    path = _path_for(kind, want, root)
    before = _tree(root)
    cwd = os.getcwd()
    os.chdir(root)  # relative paths (".", "fresh") land in the example's own folder
    try:
        code = main([path if a == "{}" else a for a in argv])
    finally:
        os.chdir(cwd)
    out = capsys.readouterr()
    assert code in (0, 2), out.err
    if code == 2:
        assert out.err.startswith("unmask: error: ") and len(out.err.strip().splitlines()) == 1, out.err
        assert _tree(root) == before, f"an error left files behind: {set(_tree(root)) - set(before)}"
    else:
        wrong = {"inside a file", "nowhere", "empty"} | ({"existing folder", "dot"} if want in ("file", "figure")
                                                         else {"existing file"})
        assert kind not in wrong, f"{command} accepted {kind} {path!r}"
        assert not [p for p in _tree(root) if any(s in p for s in LEFTOVERS)]


@pytest.mark.parametrize("args,needle", [
    (["roofline", "--batches", "0"], "--batches '0'"),
    (["roofline", "--batches=-8"], "--batches '-8'"),
    (["roofline", "--bytes-per-param=-2"], "--bytes-per-param -2"),
    (["roofline", "--params=-1"], "--params -1"),
    (["roofline", "--tau", "0"], "--tau 0"),
    (["roofline", "--prompt", "0"], "--prompt 0"),
    (["diagnose", "--out", "adir"], "--out adir: adir is a folder"),
    (["diagnose", "--out", "report.png"], "the report is JSON"),
    (["roofline", "--hardware", "h200", "--plot", "adir"], "--plot adir: adir is a folder"),
    (["roofline", "--hardware", "h200", "--plot", "r.json"], "cannot be written as 'json'"),
    (["bench", "--out", "afile"], "--out afile is a file"),
    (["gsm8k", "--data", "afile"], "--data afile is a file"),
    (["generate", "x", "--model", "afile"], "model folder afile is a file"),
    (["generate", "x", "--model", ""], "is empty"),
])
def test_named_bad_paths_and_flags(tmp_path, capsys, args, needle):
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        code = main(args)
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "afile"]  # nothing written
    assert not any((tmp_path / "adir").iterdir())
