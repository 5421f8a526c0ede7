"""Bad input never crashes, never lies, never loses data (issue 10's examples, each as a test)."""

import json
import os
import shutil

import pytest

from unmask import LLM, GenerationParams, UnmaskError
from unmask.cli import main


def run(capsys, *args):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line_error(code, err, needle):
    assert code == 2, err
    assert needle in err, err
    assert err.startswith("unmask: error: ") and len(err.strip().splitlines()) == 1


# --- valid input accepted, checked against the model's own defaults -------------------------------

@pytest.mark.parametrize("flags", [["--block-length", "24"], ["--steps", "6"], ["--block-length", "8"],
                                   ["--gen-length", "12"]])
def test_embedded_model_accepts_flags_against_its_own_shape(capsys, flags):
    code, out, err = run(capsys, "generate", "copy : red 4 owl", "--json", *flags)
    assert code == 0, err
    assert json.loads(out)["text"] == ["red 4 owl"] or "--gen-length" in flags


# --- nothing silently wrong ---------------------------------------------------------------------

@pytest.mark.parametrize("flags,needle", [
    (["--temperature", "inf"], "temperature inf is outside [0, inf)"),
    (["--temperature", "nan"], "temperature nan"),
    (["--compat", "dream", "--eps", "nan"], "eps nan is outside (0, 1)"),
    (["--compat", "dream", "--eps", "-1"], "eps -1.0 is outside (0, 1)"),
    (["--threshold", "0.5", "--gamma", "0.2"], "belong to different policies"),
])
def test_meaningless_values_are_refused(capsys, flags, needle):
    one_line_error(*run(capsys, "generate", "copy : red 4 owl", *flags)[::2], needle)


def test_out_of_vocabulary_words_are_named(capsys, embedded):
    one_line_error(*run(capsys, "generate", "copy : red banana owl")[::2], "not in the vocabulary: 'banana'")
    with pytest.raises(UnmaskError, match="'banana', 'kiwi'"):
        embedded.generate(["copy : banana kiwi owl"])


@pytest.mark.parametrize("flags", [["--cache", "dual"], ["--policy", "threshold"], ["--compat", "llada"],
                                   ["--block-length", "8"]])
def test_flags_an_autoregressive_model_ignores_are_refused(capsys, flags):
    one_line_error(*run(capsys, "generate", "--model", "default-ar", "copy : red 4 owl", *flags)[::2],
                   "not used by an autoregressive model")


def test_ar_api_refuses_diffusion_settings_and_takes_its_own(embedded_ar):
    ar = embedded_ar
    with pytest.raises(UnmaskError, match="cache: not used by an autoregressive model"):
        ar.generate(["copy : red 4 owl"], GenerationParams(gen_length=24, cache="dual"))
    assert ar.generate(["copy : red 4 owl"]).results[0].text == "red 4 owl"


@pytest.mark.parametrize("prompts,needle", [
    ([[1, 2.0]], "token id 2.0 is not an integer"),
    ([[True, 5]], "token id True is not an integer"),
    (["copy : red 4 owl", [5, 6]], "prompts mix text and token ids"),
    (5, "prompts must be a string"),
    ([], "no prompts given"),
    ([""], "prompt 0 is empty"),
])
def test_api_prompt_types(embedded, prompts, needle):
    with pytest.raises(UnmaskError, match=needle):
        embedded.generate(prompts)


def test_api_params_types(embedded):
    llm = embedded
    assert llm.generate(["copy : red 4 owl"], {"policy": "entropy", "gamma": 0.5}).results[0].text == "red 4 owl"
    with pytest.raises(UnmaskError, match="params must be a GenerationParams or a dict"):
        llm.generate(["copy : red 4 owl"], 3)
    with pytest.raises(UnmaskError, match="threshold '0.9' must be a number"):
        GenerationParams(threshold="0.9")
    with pytest.raises(UnmaskError, match="seed 'abc' must be an integer"):
        GenerationParams(seed="abc")


@pytest.mark.parametrize("device,needle", [("foo", "unknown device 'foo'"), ("cuda:7", "device 'cuda:7'")])
def test_devices_torch_does_not_have(capsys, device, needle):
    one_line_error(*run(capsys, "generate", "copy : red 4 owl", "--device", device)[::2], needle)


def test_mask_id_beyond_the_vocabulary_is_refused_at_load(llada_dir, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(llada_dir, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["mask_token_id"] = cfg["embedding_size"] + 5
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnmaskError, match="mask token id .* is outside the model's vocabulary"):
        LLM(folder)


@pytest.mark.parametrize("change,needle", [
    ({"n_heads": 3}, "not a multiple of the 3 attention heads"),
    ({"d_model": "32"}, "d_model '32' must be an integer"),
    ({"n_layers": 10**9}, "says 1000000000 layers"),
    ({"rope_theta": -1}, "rope_theta -1.0 must be a finite number > 0"),
])
def test_bad_config_values_are_named(llada_dir, tmp_path, change, needle):
    folder = tmp_path / "m"
    shutil.copytree(llada_dir, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(change)
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnmaskError, match=needle):
        LLM(folder)


@pytest.mark.parametrize("args,needle", [
    (["roofline", "--params", "0"], "--params 0 must be a finite number > 0"),
    (["roofline", "--params", "inf"], "must be a finite number > 0"),
    (["roofline", "--hardware", "h200", "--bytes-per-param", "-2"], "--bytes-per-param -2 must be"),
    (["roofline", "--json", "--gen", "0"], "gen 0 must be a positive integer"),
    (["roofline", "--json", "--batches", "0,8"], "--batches '0,8' needs integers >= 1"),
    (["bench", "--quick", "--blocks", "0"], "--blocks '0' needs integers >= 1"),
    (["gsm8k", "--data", "/nonexistent/gsm", "--n", "1"], "--data /nonexistent/gsm does not exist"),
    (["train", "--out", "x", "--tasks", "copy=-1"], "task weight '-1' for 'copy' must be a finite number > 0"),
    (["eval", "--n", "251"], "split 'selection' holds 250 examples of each task, not 251"),
    (["eval", "--split", "test"], "argument --split: invalid choice: 'test'"),
    (["bench", "--n", "800", "--split", "report", "--quick"], "split 'report' holds 750 examples"),
    (["bench", "--tolerance", "nan"], "--tolerance nan must be"),
])
def test_command_arguments(capsys, args, needle):
    one_line_error(*run(capsys, *args)[::2], needle)


# --- no data loss ---------------------------------------------------------------------------------

TINY = ["--steps", "1", "--layers", "1", "--d-model", "32", "--heads", "2", "--mlp", "32", "--batch", "2",
        "--gen-length", "24", "--quiet", "--eval-every", "100"]


def test_train_never_writes_into_a_folder_it_does_not_own(capsys, tmp_path):
    other = tmp_path / "other"
    (other / "model").mkdir(parents=True)
    (other / "model" / "keep.txt").write_text("mine")  # a run folder without trainer state
    one_line_error(*run(capsys, "train", "--out", other, *TINY)[::2], "holds no unmask run")
    assert (other / "model" / "keep.txt").read_text() == "mine"
    afile = tmp_path / "afile"
    afile.write_text("x")
    one_line_error(*run(capsys, "train", "--out", afile, *TINY)[::2], "is a file; it must be a folder")
    one_line_error(*run(capsys, "train", "--out", afile / "sub", *TINY)[::2], "is a file, so nothing can be created")
    assert afile.read_text() == "x"
    assert run(capsys, "train", "--out", other, "--overwrite", *TINY)[0] == 0
    assert (other / "trainer_state.pt").exists()


def test_failed_train_start_leaves_nothing(capsys, tmp_path):
    out = tmp_path / "run"
    one_line_error(*run(capsys, "train", "--out", out, "--init-from", tmp_path / "missing", *TINY)[::2],
                   "does not exist")
    assert not out.exists()
    one_line_error(*run(capsys, "train", "--out", out, "--init-from", "default", *TINY)[::2],
                   "do not fit this model's size")
    assert not out.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_train_into_a_read_only_folder(capsys, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    one_line_error(*run(capsys, "train", "--out", ro / "run", *TINY)[::2], "cannot write the run folder")


def test_bench_checks_its_output_folder_before_measuring(capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    one_line_error(*run(capsys, "bench", "--quick", "--out", afile / "sub")[::2], "is a file, so nothing can be created")


def test_bench_writes_each_row_as_it_finishes(capsys, tmp_path, monkeypatch):
    """An interrupted run keeps what it measured: the JSON holds every finished row."""
    import unmask.bench.runner as runner

    real, calls = runner.measure, []

    def measure_then_stop(*args, **kw):
        if calls:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(runner, "measure", measure_then_stop)
    code = main(["bench", "--policies", "threshold:0.9", "--caches", "none,dual", "--blocks", "24", "--batches", "1",
                 "--tasks", "copy", "--n", "2", "--out", str(tmp_path), "--quiet", "--ar-model", "none"])
    assert code == 130
    files = list(tmp_path.glob("bench-*.json"))
    assert len(files) == 1
    run_ = json.loads(files[0].read_text())
    assert run_["complete"] is False and len(run_["results"]) == 1 and run_["configurations"] == 2


def test_internal_errors_are_one_line(capsys, monkeypatch):
    import unmask.cli as cli

    def boom(a):
        raise ZeroDivisionError("boom")

    monkeypatch.setitem(cli.COMMANDS, "roofline", boom)
    code, _, err = run(capsys, "roofline")
    assert code == 1 and "internal error: ZeroDivisionError: boom" in err and len(err.strip().splitlines()) == 1
