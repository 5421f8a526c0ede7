"""Bad input on the newer surfaces, by class (issue 48 §3): hole lengths no canvas can hold or not
written in ASCII digits, structured output given as a dict or a bare string, GBNF grammars —
each refused by name (or accepted) on every front end, never a traceback."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unmask import LLM
from unmask.constrain import Constraint
from unmask.errors import UnmaskError
from unmask.holes import split


@pytest.fixture(scope="module")
def llm():
    return LLM()


@given(n=st.integers(min_value=1_000_001, max_value=10**40))
@settings(max_examples=40, deadline=None)
def test_a_hole_longer_than_any_canvas_is_refused_by_name(n):
    with pytest.raises(UnmaskError, match="longer than any canvas"):
        split(f"copy : red <|hole:{n}|> owl")


@given(d=st.characters(whitelist_categories=("Nd",)).filter(lambda c: not "0" <= c <= "9"))
@settings(max_examples=40, deadline=None)
def test_hole_lengths_take_ascii_digits_only(d):
    with pytest.raises(UnmaskError, match="is not a hole marker"):
        split(f"copy : red <|hole:{d}|> owl")


def test_every_front_end_refuses_a_huge_hole(llm, tmp_path):
    from unmask.cli import main

    text = "copy : red <|hole:99999999999999999999|> owl"
    with pytest.raises(UnmaskError, match="longer than any canvas"):
        llm.infill(text, llm.default_params())
    assert main(["generate", "--template", text]) == 2  # a usage error, not an internal one


def test_structured_output_as_a_dict_or_a_string(llm):
    out = llm.generate(["json : name bob"], llm.default_params(gen_length=24), chat=False,
                       constraint={"type": "object"}).results[0]
    assert Constraint.json_schema({"type": "object"}).matches(out.text)
    for bad in ("json", 5, ["a"]):
        with pytest.raises(UnmaskError, match="must be a unmask.constrain.Constraint"):
            llm.generate(["json : name bob"], llm.default_params(gen_length=8), chat=False, constraint=bad)


def test_gbnf_grammars_are_read(llm):
    g = Constraint.of("grammar", 'root ::= "red" | "blue"')
    out = llm.generate(["copy : red"], llm.default_params(gen_length=8), chat=False, constraint=g).results[0]
    assert out.text in ("red", "blue")
    with pytest.raises(UnmaskError, match="GBNF could not be read"):
        llm.generate(["copy : red"], llm.default_params(gen_length=8), chat=False,
                     constraint=Constraint.of("grammar", "root ::= ( unclosed"))


def test_cli_usage_errors_for_templates_and_training(tmp_path, capsys):
    from unmask.cli import main

    assert main(["generate", "--template", "--prompt-ids", "1,2", "copy : red <|hole:2|>"]) == 2
    assert "--prompt-ids cannot be one" in capsys.readouterr().err
    out = tmp_path / "run"
    rc = main(["train", "--out", str(out), "--kind", "diffusion", "--layers", "1", "--d-model", "32", "--heads", "2",
               "--mlp", "64", "--gen-length", "4", "--batch", "4", "--steps", "2", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "use --gen-length" in err and "internal error" not in err
    assert not out.exists()  # nothing half-written left behind


def test_a_language_too_long_or_unwritable_says_which(llm):
    """'No completion within gen_length' only when more room would do, with the room it takes;
    a language the vocabulary cannot finish says that instead."""
    with pytest.raises(UnmaskError, match="one of 13 tokens exists: raise gen_length"):
        llm.generate(["copy : red"], llm.default_params(gen_length=8), chat=False,
                     constraint=Constraint.of("regex", "(red ){12}red"))
    with pytest.raises(UnmaskError, match="cannot write some text the language needs"):
        llm.generate(["copy : red"], llm.default_params(gen_length=8), chat=False,
                     constraint=Constraint.of("regex", "red zzzz"))


@pytest.mark.parametrize("name", ["default-block", "default-renoise"])
def test_templates_on_models_that_read_no_text_after_a_hole(name):
    """Block and renoising models: one hole at the end decodes (any length, their parameters as
    generate shapes them); text after a hole is refused with that reason, whatever the holes."""
    llm = LLM(name)
    for template in ("copy : red owl <|hole:5|>", "copy : red owl <|hole|>"):
        res = llm.infill(template).results[0]
        assert len(res.holes) == 1 and len(res.raw_ids) == (5 if ":5" in template else llm.default_params().gen_length)
    for template in ("copy : red <|hole:4|> owl <|hole:3|> cat", "copy : red <|hole:4|> owl"):
        for hole_length in (("bound", "exact") if name == "default-block" else (None,)):
            with pytest.raises(UnmaskError, match="needs a full-attention masked diffusion model; .* cannot see it"):
                llm.infill(template, {"hole_length": hole_length})
