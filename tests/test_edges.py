"""Issue 33's classes of bad input on the surfaces added late (renoising, compat modes, the kernel
cache, tensor and data parallelism, Ray, the roofline, the server's wire types), each a named
refusal or a clear error, and `unmask models`."""

import json
import os
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unmask import LLM, GenerationParams, UnmaskError
from unmask.engine.renoise import RENOISE_FIELDS
from unmask.loading import EMBEDDED_ABOUT
from unmask.models.registry import FAMILIES
from unmask.params import PARAM_FIELDS

from test_errors import one_line_error, run  # noqa: E402  the same CLI runner and refusal rule


def refused(capsys, needle, *args):
    """The command's one-line refusal naming `needle` (test_errors' rule), and its text."""
    code, _, err = run(capsys, *args)
    one_line_error(code, err, needle)
    return err


@pytest.fixture(scope="module")
def renoise():
    return LLM("default-renoise")


# --- settings silently ignored ------------------------------------------------------------------

@pytest.mark.parametrize("flags,needle", [
    (["--policy", "fixed"], "policy 'fixed': not used by a renoising model"),
    (["--block-length", "8"], "block_length 8: not used by a renoising model"),
    (["--cache", "dual"], "cache 'dual': not used by a renoising model"),
    (["--steps", "4"], "steps 4: not used by a renoising model (use max_denoising_steps"),
    (["--temperature", "0.5"], "temperature 0.5: not used by a renoising model (its temperature falls"),
    (["--threshold", "0.5"], "threshold 0.5: not used"),
    (["--no-early-stop"], "early_stop False: not used"),
])
def test_renoising_model_refuses_what_its_sampler_ignores(capsys, flags, needle):
    refused(capsys, needle, "generate", "--model", "default-renoise", "copy : red 4 owl", *flags)


def test_renoising_model_takes_its_own_settings(capsys, renoise):
    for flags in ([], ["--gamma", "0.2"], ["--policy", "entropy"], ["--max-denoising-steps", "8"], ["--seed", "3"]):
        code, out, err = run(capsys, "generate", "--model", "default-renoise", "copy : red 4 owl", "--json", *flags)
        assert code == 0, err
    # the Python API: GenerationParams fields that differ from the reference are refused by name too
    with pytest.raises(UnmaskError, match="block_length 8: not used by a renoising model"):
        renoise.generate(["copy : red 4 owl"], GenerationParams(gen_length=24, block_length=8))
    with pytest.raises(UnmaskError, match="policy 'threshold'"):
        renoise.generate(["copy : red 4 owl"], GenerationParams(gen_length=24, block_length=24, policy="threshold"))
    with pytest.raises(UnmaskError, match="cache 'prefix'"):
        renoise.default_params(cache="prefix")


FLAG_VALUES = st.one_of(st.integers(-2, 40).map(str), st.sampled_from(
    ["0.2", "0.9", "fixed", "entropy", "threshold", "dual", "none", "prefix", "diffusion-gemma", "llada", "0", "1"]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(sorted(n for n in PARAM_FIELDS if n != "early_stop")), FLAG_VALUES,
                       min_size=1, max_size=3))
def test_renoising_flags_used_or_refused(renoise, flags):
    """Whatever flags a user gives a renoising model, each is one its sampler reads, or the call is
    an UnmaskError naming a field: never accepted and then ignored."""
    from unmask.cli.common import params_for

    args = {n: None for n in PARAM_FIELDS}
    args.update(flags)
    try:
        params_for(renoise, __import__("argparse").Namespace(**args), fast=True)
    except UnmaskError as e:
        assert str(e) and "\n" not in str(e)
        return
    from unmask.params import coerce

    given = {n: coerce(n, v) for n, v in flags.items()}  # 'none' is "not given" for optional fields
    ignored = {n for n, v in given.items() if v is not None and n not in RENOISE_FIELDS
               and not (n == "policy" and v == "entropy") and not (n == "temperature" and v == 0)}
    assert not ignored, (flags, ignored)


def test_renoising_server_refuses_a_policy(renoise):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from test_server import Server

    s = Server(renoise)
    try:
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "copy : red 4 owl", "policy": "fixed"})
        assert r.status_code == 400 and "policy 'fixed': not used by a renoising model" in r.text, r.text
        assert r.json()["error"]["param"] == "policy"
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "copy : red 4 owl", "block_length": 8})
        assert r.status_code == 400 and r.json()["error"]["param"] == "block_length"
        assert httpx.post(s.url + "/v1/completions", json={"prompt": "copy : red 4 owl"}).status_code == 200
        # the playground's form sends a policy, cache and blocks only to a masked model
        assert '<body data-kind="renoising" data-hole="0">' in httpx.get(s.url + "/").text
    finally:
        s.stop()
    from unmask.server.playground import page

    assert '<body data-kind="masked" data-hole="0">' in page().body.decode()
    assert '<body data-kind="masked" data-hole="1">' in page("masked", True).body.decode()


@pytest.mark.parametrize("args,needle", [
    (["serve", "--ray-address", "auto"], "--ray-address is a setting of Ray Serve replicas"),
    (["serve", "--replica-cpus", "2"], "--replica-cpus is a setting of Ray Serve replicas"),
    (["serve", "--replicas", "2", "--target-ongoing-requests", "3"], "with a fixed --replicas 2 it would be ignored"),
    (["serve", "--replicas", "1", "--replica-gpus", "1", "--device", "cpu"], "GPUs they do not use"),
    (["serve", "--replicas", "1", "--replica-cpus", "nan"], "--replica-cpus nan must be a finite number >= 0"),
    (["serve", "--min-replicas", "1", "--target-ongoing-requests", "0"], "must be > 0"),
    (["generate", "copy : red 4 owl", "--linear-kernel", "onednn", "--dtype", "bfloat16"],
     "linear_kernel 'onednn' is a float32 CPU kernel"),
])
def test_serving_and_kernel_settings_that_would_be_ignored(capsys, args, needle):
    import ray

    refused(capsys, needle, *args)
    assert not ray.is_initialized()


def test_data_and_tensor_parallel_together_are_refused(capsys):
    import ray

    refused(capsys, "--data-parallel 2 with --tensor-parallel 2", "eval", "--n", "2", "--data-parallel", "2",
            "--tensor-parallel", "2")
    refused(capsys, "--data-parallel 2 with --tensor-parallel 2", "humaneval", "--n", "1", "--data-parallel", "2",
            "--tensor-parallel", "2")
    refused(capsys, "--ray-address 'auto' is used with --data-parallel", "gsm8k", "--n", "1", "--ray-address",
            "auto")
    assert not ray.is_initialized()


# --- refusals that name what the user can change -------------------------------------------------

@pytest.mark.parametrize("mode,needle", [("llada2", "compat 'llada2' reproduces LLaDA2.1's generate on llada2"),
                                         ("diffusion-gemma", "on diffusion_gemma models; this is a llada model"),
                                         ("fast-dllm-v2", "this is a llada model")])
def test_compat_on_another_family_names_the_family(capsys, embedded, mode, needle):
    err = refused(capsys, needle, "generate", "copy : red 4 owl", "--compat", mode)
    assert "steps" not in err
    with pytest.raises(UnmaskError, match=needle):
        embedded.generate(["copy : red 4 owl"], GenerationParams(gen_length=24, block_length=24, compat=mode))


@pytest.mark.parametrize("content", ['{"Intel | 2 threads": {"256x768": "garbage"}}', "[1, 2]", "{not json",
                                     '{"m": {"256x768": {"from_rows": true}}}'])
def test_damaged_kernel_cache_is_named_and_measured_again(tmp_path, monkeypatch, content):
    from unmask.layers.dispatch import cache_path

    monkeypatch.setenv("UNMASK_CACHE_DIR", str(tmp_path))
    cache_path().write_text(content)
    with pytest.warns(UserWarning, match=f"linear-kernel cache {cache_path()} is damaged"):
        llm = LLM("default", linear_kernel="auto")
    assert llm.generate(["copy : red 4 owl"]).results[0].text == "red 4 owl"
    record = json.loads(cache_path().read_text())  # rewritten as the record unmask writes
    assert all(isinstance(e["from_rows"], int) for known in record.values() for e in known.values())


# --- internal errors and hangs -------------------------------------------------------------------

def test_bad_tp_timeout_is_named_before_processes_start(capsys, monkeypatch):
    monkeypatch.setenv("UNMASK_TP_TIMEOUT", "abc")
    env = {**os.environ, "UNMASK_TP_TIMEOUT": "abc"}
    out = subprocess.run([sys.executable, "-c", "import unmask, unmask.cli"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr  # importing never reads it
    refused(capsys, "UNMASK_TP_TIMEOUT 'abc' must be a number of seconds > 0", "generate", "copy : red 4 owl",
            "--tensor-parallel", "2")
    monkeypatch.setenv("UNMASK_TP_TIMEOUT", "-5")
    refused(capsys, "UNMASK_TP_TIMEOUT '-5'", "generate", "copy : red 4 owl", "--tensor-parallel", "2")
    import unmask.parallel.group as par

    assert not par._ACTIVE or par._ACTIVE[-1].closed  # no group was started


@pytest.mark.parametrize("address,needle", [("garbage", "--ray-address 'garbage' is not a Ray address"),
                                            ("127.0.0.1:99999", "is not a Ray address"),
                                            ("127.0.0.1:1", "no Ray cluster answers there")])
def test_ray_addresses_are_checked_before_anything_starts(capsys, address, needle):
    import ray

    t0 = time.monotonic()
    refused(capsys, needle, "eval", "--n", "2", "--data-parallel", "2", "--ray-address", address)
    refused(capsys, needle, "serve", "--replicas", "1", "--ray-address", address, "--port", "0")
    assert time.monotonic() - t0 < 30
    assert not ray.is_initialized()


@pytest.mark.parametrize("flags,needle", [
    (["--tensor-parallel", "0"], "tensor_parallel 0 must be a positive integer"),
    (["--dtype", "float8"], "unknown dtype 'float8'"),
    (["--device", "tpu"], "device 'tpu' is not supported"),
    (["--quantize", "fp8", "--device", "cpu"], "quantize fp8: on CPU"),
    (["--draft", "default-dflash", "--tensor-parallel", "2"], "does not combine with tensor_parallel 2"),
    (["--linear-kernel", "default", "--model", "/nonexistent/model"], "/nonexistent/model does not exist"),
])
def test_replica_settings_are_checked_before_ray_starts(capsys, flags, needle):
    import ray

    t0 = time.monotonic()
    refused(capsys, needle, "serve", "--replicas", "1", "--port", "0", *flags)
    assert time.monotonic() - t0 < 10 and not ray.is_initialized()


# --- impossible predictions ----------------------------------------------------------------------

@pytest.mark.parametrize("args,needle", [
    (["roofline", "--tau", "64", "--block", "8"], "--tau 64 exceeds --block 8"),
    (["roofline", "--tau", "8", "--gen", "4", "--block", "8"], "--tau 8 exceeds --gen 4"),
    (["roofline", "--model", "qwen3-8b", "--hardware", "h200", "--draft-layers", "5", "--block", "4", "--tau", "5"],
     "--tau 5 exceeds --block 4"),
])
def test_roofline_tau_within_the_positions(capsys, args, needle):
    refused(capsys, needle, *args)


def test_dflash_table_keeps_acceptance_lengths_within_its_block(capsys):
    code, out, err = run(capsys, "roofline", "--model", "qwen3-8b", "--hardware", "h200", "--draft-layers", "5",
                         "--block", "4", "--json")
    assert code == 0, err
    taus = {r["tau"] for r in json.loads(out)["rows"]}
    assert taus == {2.0, 4.0}
    from unmask.bench import roofline as rl
    from unmask.bench import shapes
    from unmask.bench import roofline_tables as rt

    target = rl.build("h200", shapes.dense_shape("qwen3-8b"), None, None, False)
    with pytest.raises(UnmaskError, match="tau 6"):
        rt.speculative_table(target, target, 512, 4, taus=(2.0, 6.0))


# --- the catalogue --------------------------------------------------------------------------------

def test_models_lists_embedded_models_and_layouts(capsys):
    code, out, _ = run(capsys, "models")
    assert code == 0
    for name in EMBEDDED_ABOUT:
        assert f"  {name} " in out
    for fam in FAMILIES:
        assert fam.layout in out
    code, out, _ = run(capsys, "models", "--json")
    data = json.loads(out)
    assert [r["name"] for r in data["embedded"]] == list(EMBEDDED_ABOUT)
    assert len(data["layouts"]) == len(FAMILIES) + 1  # and the DFlash drafter's
    from unmask.cli import build_parser

    for cmd in ("generate", "eval", "serve", "gsm8k"):  # --model's help comes from the same table
        sub = build_parser()._subparsers._group_actions[0].choices[cmd]
        text = next(a.help for a in sub._actions if a.dest == "model")
        for fam in FAMILIES:
            assert fam.layout.split(" (")[0] in text
        for name in EMBEDDED_ABOUT:
            assert name in text or name == "default-dflash"


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tau=st.one_of(st.floats(-2, 80), st.just(float("nan"))), block=st.integers(-1, 70), gen=st.integers(-1, 70))
def test_roofline_predictions_are_possible_or_refused(capsys, tau, block, gen):
    """Every prediction the roofline prints has 0 < tau <= block and tau <= gen; the rest is a named refusal."""
    code, out, err = run(capsys, "roofline", "--json", f"--tau={tau}", f"--block={block}", f"--gen={gen}")
    if code == 0:
        setup = json.loads(out)["setup"]
        assert 0.01 <= setup["tau"] <= min(setup["block"], setup["gen"])
    else:
        assert code == 2 and err.startswith("unmask: error: --"), err
