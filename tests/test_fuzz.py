"""Fuzzing the boundaries (hypothesis): generation parameters, the CLI's decoding flags, the Python
API's argument types and damaged checkpoint folders. Every outcome is a result or a clean error
(UnmaskError; CLI exit status 2 with one line), never another exception, and nothing outside the
temporary folder changes."""

import hashlib
import json
import math
import random
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unmask import LLM, GenerationParams, UnmaskError
from unmask.cli import main
from unmask.params import PARAM_FIELDS

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 600), st.integers(-2**70, 2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.sampled_from(["fixed", "threshold", "dual", "prefix", "none", "llada", "dream", "fast-dllm", "origin",
                     "entropy", "prob", "margin", "random", "0.9", "24", "nan"]),
    st.lists(st.integers(0, 5), max_size=3),
)


def _tree_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(folder)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


@FAST
@given(st.dictionaries(st.sampled_from(sorted(PARAM_FIELDS)), ANY_VALUE, max_size=6))
def test_generation_params_accept_or_name_the_problem(kw):
    try:
        p = GenerationParams(**kw).check()
    except UnmaskError as e:
        assert str(e) and "\n" not in str(e)
        return
    assert p.gen_length % p.block_length == 0 and p.total_steps % p.num_blocks == 0


FLAG_VALUES = st.one_of(st.integers(-3, 70).map(str), st.floats(allow_nan=True).map(str),
                        st.text(alphabet="abcxyz0123456789.-,e", max_size=6),
                        st.sampled_from(["fixed", "threshold", "factor", "entropy", "budget", "dual", "prefix",
                                         "none", "llada", "fast-dllm", "dream", "random", "margin", "true", "inf"]))


@FAST
@given(st.dictionaries(st.sampled_from(sorted(n for n in PARAM_FIELDS if n != "early_stop")), FLAG_VALUES,
                       max_size=4))
def test_cli_decoding_flags_never_crash(llada_dir, llada, capsys, monkeypatch, flags):
    import unmask.cli.decode

    monkeypatch.setattr(unmask.cli.decode, "load_llm", lambda a: llada)  # loaded once, not per example
    argv = ["generate", "--model", str(llada_dir), "--prompt-ids", "1,2,3", "--json"]
    for name, value in flags.items():
        argv += ["--" + name.replace("_", "-"), value]
    code = main(argv)
    out = capsys.readouterr()
    assert code in (0, 2), out.err
    if code == 2:
        assert out.err.startswith("unmask: error: ") and len(out.err.strip().splitlines()) == 1
    else:
        assert json.loads(out.out)["nfe"] >= 1


PROMPTS = st.one_of(
    st.none(), st.integers(), st.floats(), st.text(max_size=12), st.booleans(),
    st.lists(st.one_of(st.text(max_size=6), st.integers(-3, 80), st.floats(), st.none()), max_size=3),
    st.lists(st.lists(st.one_of(st.integers(-2, 70), st.floats(), st.booleans(), st.text(max_size=2)), max_size=4),
             max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
PARAMS = st.one_of(st.none(), st.integers(), st.text(max_size=4),
                   st.dictionaries(st.sampled_from(["gen_length", "block_length", "policy", "colour", "threshold"]),
                                   ANY_VALUE, max_size=3))


@FAST
@given(prompts=PROMPTS, params=PARAMS, chat=st.one_of(st.none(), st.booleans(), st.integers()))
def test_api_argument_types(llada, prompts, params, chat):
    try:
        out = llada.generate(prompts, params, chat=chat)
    except UnmaskError as e:
        assert str(e)
        return
    assert len(out.results) >= 1


@pytest.mark.parametrize("bad", [42, 3.5, ["a"], {"model": "x"}])
def test_api_model_argument_types(bad):
    with pytest.raises(UnmaskError):
        LLM(bad)


# --- damaged checkpoints -------------------------------------------------------------------------

def _corrupt(folder: Path, rnd: random.Random, kind: str) -> None:
    shards = sorted(folder.glob("*.safetensors"))
    if kind == "truncate":
        f = rnd.choice(shards)
        data = f.read_bytes()
        f.write_bytes(data[: rnd.randrange(len(data))])
    elif kind == "bitflip":
        f = rnd.choice(shards)
        data = bytearray(f.read_bytes())
        for _ in range(rnd.randint(1, 8)):
            i = rnd.randrange(len(data))
            data[i] ^= 1 << rnd.randrange(8)
        f.write_bytes(bytes(data))
    elif kind == "garbage":
        rnd.choice(shards).write_bytes(bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 200))))
    elif kind == "config_value":
        cfg = json.loads((folder / "config.json").read_text())
        key = rnd.choice(sorted(cfg))
        cfg[key] = rnd.choice([None, -1, 0, 3, 10**12, 1.5, "x", [], {}, True, math.nan, 7])
        (folder / "config.json").write_text(json.dumps(cfg))
    elif kind == "config_shape":
        cfg = json.loads((folder / "config.json").read_text())
        cfg[rnd.choice(["d_model", "n_heads", "n_kv_heads", "n_layers", "mlp_hidden_size", "vocab_size",
                        "embedding_size"])] = rnd.choice([16, 48, 64, 3, 5, 1])
        (folder / "config.json").write_text(json.dumps(cfg))
    elif kind == "json_not_object":
        name = rnd.choice(["config.json", "tokenizer_config.json", "generation_config.json",
                           "model.safetensors.index.json"])
        (folder / name).write_text(rnd.choice(["[1, 2]", "42", "\"text\"", "null", "{", ""]))
    elif kind == "tokenizer":
        f = folder / "tokenizer.json"
        data = f.read_bytes()
        f.write_bytes(data[: rnd.randrange(len(data))])
    elif kind == "token_ids":
        cfg = json.loads((folder / "config.json").read_text())
        cfg[rnd.choice(["mask_token_id", "eos_token_id", "pad_token_id"])] = rnd.choice([-1, 10**6, 2.5, "a", [], 0])
        (folder / "config.json").write_text(json.dumps(cfg))
    elif kind == "missing":
        rnd.choice([p for p in folder.iterdir() if p.is_file()]).unlink()


KINDS = ["truncate", "bitflip", "garbage", "config_value", "config_shape", "json_not_object", "tokenizer",
         "token_ids", "missing"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(KINDS), seed=st.integers(0, 2**32 - 1))
def test_damaged_checkpoints_load_or_name_the_fault(llada_dir, tmp_path_factory, kind, seed):
    before = _tree_digest(llada_dir)
    folder = tmp_path_factory.mktemp("damaged")
    shutil.copytree(llada_dir, folder, dirs_exist_ok=True)
    _corrupt(folder, random.Random(seed), kind)
    try:
        llm = LLM(folder)
        out = llm.generate([[1, 2, 3]], GenerationParams(gen_length=8, block_length=8))
        assert len(out.results[0].raw_ids) == 8  # damage the loader cannot see (data bits) still decodes
    except UnmaskError as e:
        assert str(e) and "\n" not in str(e)
    assert _tree_digest(llada_dir) == before  # the source folder is untouched
    shutil.rmtree(folder)


def test_damaged_file_is_named(llada_dir, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(llada_dir, folder)
    shard = sorted(folder.glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(UnmaskError, match=shard.name):
        LLM(folder)
    (folder / "config.json").write_text("[1]")
    with pytest.raises(UnmaskError, match="config.json must hold a JSON object"):
        LLM(folder)
