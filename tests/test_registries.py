"""One definition per decision: the policy, cache and compat registries, the parameter fields,
and everything derived from them (CLI flags, bench grid, lm-eval arguments, defaults) agree; a
new policy is one registered class. Plus the shared canvas layout and the fast defaults."""

import argparse
from dataclasses import dataclass, fields

import pytest
import torch

from unmask import GenerationParams, UnmaskError
from unmask.bench.grid import BenchConfig, build_grid, knob_names, parse_caches, parse_policies
from unmask.cache import CACHES
from unmask.cli import build_parser, main
from unmask.compat import COMPAT_MODES
from unmask.canvas import Canvas, left_padded
from unmask.params import FAST, PARAM_FIELDS, resolve_params
from unmask.sampler.policy import POLICIES, register, take_top


def _subparser(command: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def _help(command: str) -> str:
    return " ".join(str(a.help) for a in _subparser(command)._actions)


def _flags(command: str) -> set[str]:
    return {s for a in _subparser(command)._actions for s in a.option_strings}


@pytest.mark.parametrize("command", ["generate", "eval", "gsm8k", "humaneval"])
def test_every_parameter_has_its_flag(command):
    flags = _flags(command)
    for name in PARAM_FIELDS:
        assert "--" + name.replace("_", "-") in flags, name
    assert {"--model", "--dtype", "--device", "--json"} <= flags


def test_registries_agree_with_parameters_grid_and_cli():
    for name, cls in POLICIES.items():
        assert cls.name == name
        for knob in cls.implied_by():
            assert knob in PARAM_FIELDS, (name, knob)
        GenerationParams(policy=name).check()
        assert name in knob_names() and parse_policies(f"{name}:1") == [(name, 1.0)]
        BenchConfig(name, 1.0, "none", None, 8, 16, 1).params()
    for name, cls in CACHES.items():
        assert cls.name == name and parse_caches(name) == [name]
        GenerationParams(cache=name).check()
    for name, mode in COMPAT_MODES.items():
        assert mode.name == name
        GenerationParams(compat=name).check()
    help_text = _help("generate")
    for names in (POLICIES, CACHES, COMPAT_MODES):
        assert all(n in help_text for n in names)


def test_a_new_policy_is_one_registered_class(llada):
    """Register a policy and it is a valid parameter value, a CLI choice, a bench grid entry and
    decodes; remove it and it is gone everywhere."""

    @register
    @dataclass
    class TopTwo:
        name = "top2"
        knob = None
        bench_knob = "none"
        uses_schedule = False
        needs_entropy = False
        revises = False  # the protocol's fields, all declared

        @classmethod
        def implied_by(cls):
            return ()

        @classmethod
        def from_params(cls, p):
            return cls()

        @classmethod
        def bench_params(cls, value, gen_length):
            return {"policy": cls.name}

        def select(self, score, entropy, candidates, quota, step, generator):
            return take_top(score, candidates, torch.full((score.shape[0],), 2, device=score.device))

    try:
        p = GenerationParams(policy="top2", gen_length=8, block_length=8).check()
        assert "top2" in _help("generate")
        assert build_grid([("top2", 0.0)], ["none"], [0], [8], [8], [1])[0].params().policy == "top2"
        out = llada.generate([[1, 2, 3]], p)
        assert out.results[0].commits[:3] == [2, 2, 2]
    finally:
        del POLICIES["top2"]
    with pytest.raises(UnmaskError, match="unknown policy 'top2'"):
        GenerationParams(policy="top2").check()


def test_lm_eval_takes_every_parameter(llada_dir):
    pytest.importorskip("lm_eval")
    from unmask.bench.harness import UnmaskLM

    lm = UnmaskLM(model=str(llada_dir), gen_length="16", block_length="8", policy="entropy", gamma="0.5",
                  cache="dual", refresh_interval="2", early_stop="false", temperature="0.5", top_k="none")
    assert (lm.params.gamma, lm.params.cache, lm.params.refresh_interval, lm.params.early_stop, lm.params.temperature) == \
        (0.5, "dual", 2, False, 0.5)


# --- one canvas layout ------------------------------------------------------------------------------

def test_left_padded_layout():
    x, pos, km = left_padded([[5, 6, 7], [8]], 2, pad_id=0, fill_id=9)
    assert x.tolist() == [[5, 6, 7, 9, 9], [0, 0, 8, 9, 9]]
    assert pos.tolist() == [[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]]
    assert km.tolist() == [[True] * 5, [False, False, True, True, True]]
    x, pos, km = left_padded([[5, 6], [7, 8]], 3, pad_id=0, fill_id=9)
    assert km is None and pos.tolist() == [[0, 1, 2, 3, 4]] * 2


def test_training_batches_use_the_decoding_canvas():
    from unmask.tasks import held_out
    from unmask.train.data import EOS, PAD, build_tokenizer, make_batch

    tok = build_tokenizer()
    examples = held_out("word", 2) + held_out("copy", 2)
    batch = make_batch(examples, tok, 24)
    prompts = [tok.encode(ex.prompt).ids for ex in examples]
    c = Canvas.build(prompts, 24, mask_id=tok.token_to_id(EOS) + 100, pad_id=tok.token_to_id(PAD),
                     device=torch.device("cpu"))
    P = c.prompt_len
    assert batch.prompt_len == P
    assert batch.ids[:, :P].equal(c.x[:, :P])
    assert batch.positions.equal(c.positions)
    assert (batch.key_mask is None and c.key_mask is None) or batch.key_mask.equal(c.key_mask)


# --- defaults ---------------------------------------------------------------------------------------

def test_field_defaults_are_the_reference_setting():
    d = GenerationParams()
    assert (d.policy, d.cache, d.steps, d.temperature) == ("fixed", "none", None, 0.0)


def test_fast_defaults_and_what_overrides_them():
    model = {"gen_length": 24, "block_length": 24, "steps": 24}
    p = resolve_params({}, model)
    assert (p.policy, p.threshold, p.cache, p.gen_length, p.block_length) == ("threshold", 0.9, "dual", 24, 24)
    assert resolve_params({}, model, fast=False).policy == "fixed"
    assert resolve_params({"steps": 6}, model).policy == "fixed"  # a knob implies its policy
    assert resolve_params({"gamma": 0.5}, model).policy == "entropy"
    assert resolve_params({"block_length": 8}, model).block_length == 8  # checked against the model's gen
    assert resolve_params({}, {**model, "policy": "budget", "budget": 2.0}).policy == "budget"
    c = resolve_params({"compat": "llada"}, model)
    assert (c.policy, c.cache) == ("fixed", "none")  # a compat mode takes the reference's settings
    with pytest.raises(UnmaskError, match="different policies"):
        resolve_params({"gamma": 0.5, "threshold": 0.8}, model)
    assert set(FAST) <= set(PARAM_FIELDS)


def test_generate_runs_the_fast_defaults_on_the_embedded_model(capsys):
    import json

    assert main(["generate", "json : name bob age 3 4 city rome", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["params"]["policy"] == "threshold" and out["params"]["cache"] == "dual"
    assert out["text"] == ['{ "name" : "bob" , "age" : 3 4 , "city" : "rome" }']
    assert out["nfe"] <= 4  # one token per step would take 16
    from unmask import LLM

    assert LLM().default_params().cache == "dual"


def test_every_field_has_help_and_a_check_or_is_free():
    for f in fields(GenerationParams):
        assert f.metadata["help"], f.name


def test_fields_are_declared_by_the_components_that_read_them():
    """GenerationParams is assembled from what each component declares: every policy's, cache's,
    proposal's and compat mode's fields are fields of the record with their declared default and
    help; a component's knob is among them; a new component's field joins the assembly; a name
    declared twice differently is refused."""
    from unmask.knobs import Knob, merge
    from unmask.params import KNOBS, MODEL_DEFAULT_KEYS, _declared
    from unmask.sampler.proposal import ProposalConfig

    assert list(KNOBS) == list(PARAM_FIELDS)
    declared = [ProposalConfig.fields, *(c.fields for c in POLICIES.values()), *(c.fields for c in CACHES.values()),
                *(m.fields for m in COMPAT_MODES.values())]
    for own in declared:
        for name, knob in own.items():
            f = PARAM_FIELDS[name]
            assert f.default == knob.default and f.metadata["help"] == knob.help, name
            assert (name in MODEL_DEFAULT_KEYS) == knob.from_model, name
    for cls in POLICIES.values():
        assert cls.knob is None or cls.knob in KNOBS
    for cls in CACHES.values():
        assert cls.knobs == tuple(cls.fields)

    @register
    @dataclass
    class Careful:
        name = "careful"
        fields = {"care": Knob(0.5, float, "careful policy: how careful")}

    try:
        assert _declared()["care"].help == "careful policy: how careful"
        Careful.fields = {"threshold": Knob(0.5, float, "another threshold")}
        with pytest.raises(TypeError, match="'threshold' is declared twice"):
            _declared()
    finally:
        del POLICIES["careful"]
    with pytest.raises(TypeError, match="declared twice"):
        merge({"a": Knob(1, int, "a")}, {"a": Knob(1, int, "a")}, "x")


def test_a_new_cache_is_one_registered_class(llada):
    """A cache policy the engine has never heard of: one class with its plan, registered. It is a
    valid parameter value, a CLI choice and a bench entry, the engine runs it (full forward every
    other step, the open block otherwise) and the decode equals no cache when it refreshes every
    step; removed, it is gone everywhere."""
    from unmask.cache import CachePolicy, Plan
    from unmask.cache import register as register_cache
    from unmask.cache.base import REFRESH_INTERVAL

    @register_cache
    @dataclass(frozen=True)
    class EveryOther(CachePolicy):
        name = "every-other"
        period: int = 2

        @classmethod
        def from_params(cls, p):
            return cls(p.refresh_interval or 2)

        fields = {"refresh_interval": REFRESH_INTERVAL}

        def plan(self, rows, shift, align):
            return Plan.window(rows, rows.s - shift, rows.e, full=rows.age % self.period == 0)

    try:
        base = dict(gen_length=16, block_length=8, policy="fixed", early_stop=False)  # 16 steps
        assert "every-other" in _help("generate") and parse_caches("every-other:r3") == ["every-other:r3"]
        out = llada.generate([[1, 2, 3], [4, 5]], GenerationParams(cache="every-other", **base))
        assert [s.kind for s in out.steps][:4] == ["full", "window", "full", "window"]
        every = llada.generate([[1, 2, 3], [4, 5]], GenerationParams(cache="every-other", refresh_interval=1, **base))
        none = llada.generate([[1, 2, 3], [4, 5]], GenerationParams(cache="none", **base))
        assert [r.raw_ids for r in every.results] == [r.raw_ids for r in none.results]
        assert all(s.refresh for s in every.steps)
    finally:
        del CACHES["every-other"]
    with pytest.raises(UnmaskError, match="unknown cache 'every-other'"):
        GenerationParams(cache="every-other").check()
