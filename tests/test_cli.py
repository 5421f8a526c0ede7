"""The command line: output shapes and one-line errors with exit status 2."""

import json
import os
import subprocess
import sys

import pytest

from unmask.cli import main


def run(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--gen-length", "30", "--block-length", "32"], "gen_length 30 is not a multiple of block_length 32"),
        (["--steps", "3", "--gen-length", "64"], "steps 3 is not a multiple of the number of blocks 2"),
        (["--threshold", "1.5"], "threshold 1.5 is outside (0, 1]"),
        (["--threshold", "0"], "threshold 0.0 is outside (0, 1]"),
        (["--policy", "greedy"], "unknown policy 'greedy'"),
        (["--cache", "triple"], "unknown cache 'triple'"),
        (["--gen-length", "512"], "exceeds the model's maximum of 512 positions"),
        (["--compat", "vllm"], "unknown compat 'vllm'"),
        (["--refresh-interval", "0"], "refresh_interval 0 must be a positive integer"),
        (["--steps", "abc"], "--steps 'abc' is not an integer"),
    ],
)
def test_bad_input_is_one_line_with_status_2(capsys, llada_dir, args, needle):
    code, out, err = run(capsys, "generate", "--model", str(llada_dir), "w1 w2", *args)
    assert code == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--prompt-ids", "1,2,999"], "token id 999 is outside the vocabulary"),
        (["--prompt-ids", "1,x"], "'x' is not an integer token id"),
        (["--prompt-ids", "1,2", "w1"], "not both"),
        ([""], "empty prompt"),
        (["w1", "--compat", "dream"], "compat 'dream' reproduces Dream"),
    ],
)
def test_bad_prompts(capsys, llada_dir, args, needle):
    code, _, err = run(capsys, "generate", "--model", str(llada_dir), *args)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_missing_model_is_named(capsys, tmp_path):
    code, _, err = run(capsys, "generate", "--model", str(tmp_path / "nope"), "hi")
    assert code == 2 and "nope does not exist" in err


def test_json_batch_from_prompt_ids(capsys, llada_dir):
    code, out, _ = run(capsys, "generate", "--model", str(llada_dir), "--prompt-ids", "1,2,3;4,5",
                       "--gen-length", "16", "--block-length", "8", "--policy", "threshold",
                       "--threshold", "0.3", "--cache", "dual", "--json")
    assert code == 0
    obj = json.loads(out)
    assert len(obj["generated_ids"]) == 2 and len(obj["text"]) == 2
    assert obj["nfe"] >= 2 and obj["cache"] == "dual"
    assert all(sum(c) >= len(g) for c, g in zip(obj["commits"], obj["generated_ids"]))


def test_text_output_and_summary(capsys, llada_dir):
    code, out, err = run(capsys, "generate", "--model", str(llada_dir), "w1 w2", "--gen-length", "16",
                         "--block-length", "8", "--no-early-stop", "--steps", "16", "--cache", "none")
    assert code == 0 and out.strip()
    assert "nfe=16" in err and "tokens/forward=" in err


def test_module_entry_point_runs(llada_dir):
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    r = subprocess.run([sys.executable, "-m", "unmask", "generate", "--model", str(llada_dir), "--prompt-ids",
                        "1,2,3", "--gen-length", "8", "--block-length", "8", "--json"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["generated_ids"][0]) <= 8


def test_compat_json_returns_whole_canvas(capsys, llada_dir):
    code, out, _ = run(capsys, "generate", "--model", str(llada_dir), "--prompt-ids", "1,2,3",
                       "--gen-length", "16", "--block-length", "8", "--compat", "fast-dllm", "--json")
    assert code == 0 and len(json.loads(out)["generated_ids"][0]) == 16


def test_generate_with_a_suffix_and_a_template(capsys, llada_dir, tmp_path):
    """--suffix (the prompt is the text before the hole), --template (the prompt holds holes) and
    --template-file print and report what the Python API returns."""
    from unmask import LLM

    llm = LLM(llada_dir)
    code, out, _ = run(capsys, "generate", "--model", str(llada_dir), "w1 w2", "--suffix", "w3 w4",
                       "--gen-length", "8", "--block-length", "8", "--json")
    want = llm.generate("w1 w2", llm.default_params(gen_length=8, block_length=8), suffix="w3 w4", chat=False)
    assert code == 0 and json.loads(out)["text"] == [want.results[0].text]
    template = "w1 w2 <|hole:4|> w5 w6 <|hole:3|> w7"
    code, out, _ = run(capsys, "generate", "--model", str(llada_dir), "--template", template, "--json")
    obj, res = json.loads(out), llm.infill(template, llm.default_params()).results[0]
    assert code == 0 and obj["holes"] == [res.holes]
    assert obj["filled"] == [f"w1 w2 {res.holes[0]} w5 w6 {res.holes[1]} w7"]
    path = tmp_path / "t.txt"
    path.write_text(template)
    code, out, _ = run(capsys, "generate", "--model", str(llada_dir), "--template-file", str(path))
    assert code == 0 and out.strip() == obj["filled"][0]


@pytest.mark.parametrize("args,needle", [
    (["--suffix", "w3", "--prompt-ids", "1,2"], "--suffix goes with a text prompt"),
    (["--template"], "give the prompt text"),
    (["w1", "--template-file", "x.txt"], "--template-file is the whole input"),
    (["--template-file", "/nonexistent/t.txt"], "cannot read it as UTF-8 text"),
    (["--template", "w1 w2"], "template has no hole"),
    (["w1", "--suffix", "w2", "--chat"], "--chat wraps the prompt in the chat template"),
    (["--template", "w1 <|hole:2|> w2 <|hole:2|>", "--policy", "edit", "--hole-length", "exact"],
     "could rewrite the fixed text"),
])
def test_infilling_flag_errors(capsys, llada_dir, args, needle):
    code, _, err = run(capsys, "generate", "--model", str(llada_dir), *args)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_generate_with_structured_output(capsys, tmp_path):
    """--json-schema FILE, --regex, --choice and --grammar FILE: the printed answer is in the
    language (the embedded model)."""
    from unmask.constrain import Constraint

    schema = {"type": "object", "properties": {"name": {"enum": ["ann", "bob"]}}, "required": ["name"]}
    (tmp_path / "s.json").write_text(json.dumps(schema))
    (tmp_path / "g.lark").write_text('start: "{ " STR " : " STR " }"\nSTR: /"[a-z]+"/')
    cases = [(["--json-schema", str(tmp_path / "s.json")], Constraint.json_schema(schema)),
             (["--regex", "[0-9]( [0-9])*"], Constraint.regex("[0-9]( [0-9])*")),
             (["--choice", "red, blue"], Constraint.choice(["red", "blue"])),
             (["--grammar", str(tmp_path / "g.lark")], Constraint.grammar((tmp_path / "g.lark").read_text()))]
    for flags, c in cases:
        code, out, _ = run(capsys, "generate", "--model", "default", "json : name bob age 4", "--json", *flags)
        assert code == 0, flags
        text = json.loads(out)["text"][0]
        if c.kind != "grammar":
            assert c.matches(text), (flags, text)
        else:
            assert Constraint.regex(r'\{ "[a-z]+" : "[a-z]+" \}').matches(text), text


@pytest.mark.parametrize("args,needle", [
    (["w1", "--regex", "a", "--choice", "b"], "give one of --json-schema, --regex, --choice and --grammar"),
    (["w1", "--json-schema", "/nonexistent.json"], "cannot read it as UTF-8 text"),
    (["w1", "--choice", "w1", "--suffix", "w2"], "not with --suffix or a template"),
    (["w1", "--regex", "(unclosed"], "rejected by the grammar engine"),
])
def test_structured_output_flag_errors(capsys, llada_dir, args, needle):
    code, _, err = run(capsys, "generate", "--model", str(llada_dir), *args)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
