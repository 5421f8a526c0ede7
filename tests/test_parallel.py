"""Tensor parallelism on torch.distributed (gloo, 2 processes on this CPU, one thread each).

N = 2 against N = 1 on every test checkpoint family: greedy tokens identical under every commit
policy and cache, reference modes included; seeded sampling identical; logits within a stated
tolerance; the OpenAI server over a tensor-parallel model; a rank that dies ends the job with a
clear error, never a hang."""

import os
import socket
import time

import pytest
import torch
import torch.distributed as dist

from checkpoints import (write_diffusion_gemma, write_dream, write_fast_dllm_v2, write_llada, write_llada2,
                         write_llada_block, write_llada_moe, write_sdar)
from unmask import LLM
from unmask.errors import UnmaskError
from unmask.parallel import TensorParallelError

pytestmark = pytest.mark.slow  # every test here starts tensor-parallel ranks (processes)

# logits of N ranks against one process: row-parallel sums are added in another order
LOGIT_TOL = 1e-4

PROMPTS = [[3, 5, 7, 9, 11], [4, 6]]
EQUAL = [[3, 5, 7, 9, 11], [4, 6, 8, 10, 12]]  # the reference loops without padding masks need equal lengths

MASKED = [  # (policy and cache settings) every masked full-sequence family runs at N = 1 and N = 2
    dict(gen_length=16, block_length=8, steps=16),
    dict(gen_length=16, block_length=8, steps=8, cache="prefix"),
    dict(gen_length=16, block_length=8, policy="threshold", threshold=0.3, cache="dual"),
    dict(gen_length=16, block_length=8, policy="factor", factor=1.0, cache="adaptive"),
    dict(gen_length=16, block_length=8, policy="entropy", gamma=1.0, cache="dllm-cache"),
    dict(gen_length=16, block_length=8, policy="budget", budget=0.5, confidence="margin"),
    dict(gen_length=16, block_length=8, policy="threshold", threshold=0.3, confidence="neg_entropy"),
    dict(gen_length=16, block_length=8, policy="edit", threshold=0.3, edit_threshold=0.2),
    dict(gen_length=16, block_length=8, steps=8, temperature=0.8, seed=11),  # Gumbel draws, vocabulary-local
    dict(gen_length=16, block_length=8, steps=8, temperature=0.8, top_p=0.9, seed=5),  # gathered logits
    dict(gen_length=16, block_length=8, steps=8, remasking="random", seed=2),
]
BLOCK = [
    dict(),  # the family's released setting (threshold, exact cache)
    dict(policy="fixed"),
    dict(policy="threshold", threshold=0.5, cache="exact-dual"),
    dict(temperature=0.7, seed=3),
]

# LLaDA runs the whole grid; the other families the settings that reach their own code (their
# layers, sampling, caches and reference modes): the engine's policy and cache code is shared
FAMILIES = {
    "llada": (write_llada, MASKED + [dict(gen_length=16, block_length=8, steps=16, compat="llada"),
                                     dict(gen_length=16, block_length=8, steps=8, compat="fast-dllm", cache="dual",
                                          threshold=0.3)]),
    "dream": (write_dream, [MASKED[2], MASKED[6], dict(gen_length=16, steps=16, compat="dream", alg="entropy"),
                            dict(gen_length=16, steps=8, compat="dream", temperature=0.7, seed=4)]),
    "llada_moe": (write_llada_moe, MASKED[1:3]),
    "llada_block": (write_llada_block, BLOCK[:3]),
    "fast_dllm_v2": (write_fast_dllm_v2, [BLOCK[0], dict(compat="fast-dllm-v2")]),
    "sdar": (write_sdar, [BLOCK[0], BLOCK[3]]),
    "llada2": (write_llada2, [dict(compat="llada2"), dict(policy="edit", threshold=0.5, edit_threshold=0.3)]),
    # its full-attention layers' one key/value head is replicated on both ranks, the sliding layers' two split
    "diffusion_gemma": (write_diffusion_gemma, [dict(seed=3, gen_length=32)]),
}


@pytest.fixture(autouse=True)
def one_thread():
    """One thread per process: the spawned rank inherits this process's count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _run(llm, settings):
    out = []
    for s in settings:
        try:
            prompts = EQUAL if s.get("compat") in ("llada", "fast-dllm") else PROMPTS
            out.append([(r.text, r.nfe) for r in llm.generate(prompts, dict(s)).results])
        except UnmaskError as e:  # a setting a family refuses is refused alike
            out.append(("refused", str(e)))
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_two_ranks_equal_one(tmp_path, family):
    """Every policy, cache and reference mode the family runs gives the same tokens and forwards
    at N = 2 as at N = 1 (greedy, and seeded sampling)."""
    write, settings = FAMILIES[family]
    path = write(tmp_path / family)
    one = _run(LLM(path), settings)
    assert all(o[0] != "refused" for o in one), one  # the grid really runs
    with LLM(path, tensor_parallel=2) as two:
        assert two.tensor_parallel == 2
        got = _run(two, settings)
    for s, a, b in zip(settings, one, got):
        assert a == b, (family, s)


def test_ar_twin_two_ranks(tmp_path):
    """The embedded autoregressive twin (causal cache) at N = 2."""
    ids = [[5, 6, 7]]
    one = LLM("default-ar").generate(ids, {"gen_length": 12})
    with LLM("default-ar", tensor_parallel=2) as two:
        got = two.generate(ids, {"gen_length": 12})
    assert [r.text for r in got.results] == [r.text for r in one.results]


def test_engine_requests_in_lockstep(tmp_path):
    """The request engine under N = 2: staggered requests, an abort and releases replayed on rank 1."""
    from unmask.engine import EngineConfig

    path = write_llada(tmp_path / "m")
    params = dict(gen_length=16, block_length=8, policy="threshold", threshold=0.3, cache="dual")
    one = LLM(path)
    alone = {i: one.generate([p], params).results[0].token_ids for i, p in enumerate(PROMPTS + [[8, 9, 10]])}
    with LLM(path, tensor_parallel=2) as two:
        eng = two.engine(EngineConfig(max_num_seqs=4))
        p = two.default_params(**params)
        a = eng.add_request(PROMPTS[0], p)
        eng.step()
        b = eng.add_request(PROMPTS[1], p)
        c = eng.add_request([8, 9, 10], p)
        doomed = eng.add_request([12, 13], p)
        eng.step()
        assert eng.abort(doomed.id)
        while eng.has_unfinished():
            eng.step()
        for i, req in enumerate((a, b, c)):
            got = two.result_of(req.canvas, req.nfe, req.commits, 0.0).token_ids
            assert got == alone[i]
            eng.release(req.id)
        assert not eng.requests or all(r.done for r in eng.requests.values())


def test_infilling_two_ranks_equal_one(tmp_path):
    """Holes at N = 2: a suffix natively (rank 0's engine replayed), decoded at several lengths
    (consensus: the candidates' rows made on every rank), a suffix through a reference mode (every
    rank runs the batch), and a template with two holes."""
    path = write_llada(tmp_path / "m")
    p = dict(gen_length=8, block_length=8, steps=8)
    suffixes = [[11, 12, 13], [14]]
    one = LLM(path)
    extras = ({}, {"hole_length": "consensus", "hole_candidates": 4}, {"compat": "fast-dllm"})
    want = [[r.raw_ids for r in one.generate(EQUAL, dict(p, **extra), suffix=suffixes).results] for extra in extras]
    template = "w1 w2 <|hole:3|> w5 <|hole:4|> w7"
    want_t = one.infill(template, {"policy": "threshold", "threshold": 0.3}).results[0].raw_ids
    with LLM(path, tensor_parallel=2) as two:
        got = [[r.raw_ids for r in two.generate(EQUAL, dict(p, **extra), suffix=suffixes).results]
               for extra in extras]
        got_t = two.infill(template, {"policy": "threshold", "threshold": 0.3}).results[0].raw_ids
    assert got == want and got_t == want_t


def test_bad_tensor_parallel_is_refused(tmp_path):
    path = write_llada(tmp_path / "m")  # 4 heads, 2 key/value heads
    for bad in (0, -1, "2", 1.5, True):
        with pytest.raises(UnmaskError, match="tensor_parallel"):
            LLM(path, tensor_parallel=bad)
    t0 = time.time()
    with pytest.raises(UnmaskError, match="tensor_parallel 3 does not divide the model's 4 attention heads"):
        LLM(path, tensor_parallel=3)
    assert time.time() - t0 < 2  # refused from the config, before any process starts
    assert not dist.is_initialized()  # nothing half-started is left behind
    with LLM(path, tensor_parallel=2) as two:  # and a group can start afterwards
        with pytest.raises(UnmaskError, match="already running"):
            LLM(path, tensor_parallel=2)
        assert two.generate([[3, 4]], {"gen_length": 8, "block_length": 8, "steps": 8}).results


def test_dead_rank_ends_the_job(tmp_path):
    """A rank killed between steps, and one killed in the middle of a long generation: rank 0 raises
    a TensorParallelError naming it within seconds, never hangs."""
    path = write_llada(tmp_path / "m")
    params = {"gen_length": 16, "block_length": 8, "steps": 16}
    two = LLM(path, tensor_parallel=2)
    two.generate(PROMPTS, params)
    two.ranks.procs[0].kill()
    t0 = time.time()
    with pytest.raises(TensorParallelError, match="rank 1 exited"):
        two.generate(PROMPTS, params)
    assert time.time() - t0 < 30
    with pytest.raises(TensorParallelError):  # the group stays failed
        two.generate(PROMPTS, params)
    assert not dist.is_initialized()

    two = LLM(path, tensor_parallel=2)
    import threading

    killer = threading.Timer(0.5, two.ranks.procs[0].kill)
    killer.start()
    t0 = time.time()
    with pytest.raises(TensorParallelError, match="rank 1"):
        for _ in range(200):  # long enough to be running when the rank dies
            two.generate(PROMPTS * 4, {"gen_length": 64, "block_length": 8, "steps": 64})
    killer.join()
    assert time.time() - t0 < 60
    two.close()


# --- logits --------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LOGIT_FAMILIES = {"llada": write_llada, "dream": write_dream, "llada2": write_llada2, "llada_moe": write_llada_moe,
                  "sdar": write_sdar, "llada_kv_replicated": lambda f: write_llada(f, kv_heads=1)}


def _logits_rank(rank: int, world: int, port: int, paths: dict, out: str) -> None:
    from unmask.layers.parallel import TensorParallel
    from unmask.models.loader import load_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    ids = torch.tensor([[3, 5, 7, 9, 11, 13, 2, 4]])
    pos = torch.arange(ids.shape[1])[None]
    got = {}
    for name, path in paths.items():
        model, _ = load_model(path, tp=TensorParallel(rank, world))
        with torch.inference_mode():
            got[name] = {"whole": model(ids, pos), "local": model(ids, pos, vocab_local=True)}
    torch.save(got, f"{out}.{rank}")
    dist.destroy_process_group()


def test_sharded_logits_match(tmp_path):
    """For every family (and LLaDA with its key/value head replicated): each rank's vocabulary
    slice and the gathered logits are the one-process logits within LOGIT_TOL; the slices tile the
    vocabulary."""
    paths = {name: str(write(tmp_path / name)) for name, write in LOGIT_FAMILIES.items()}
    out = str(tmp_path / "logits")
    torch.multiprocessing.start_processes(_logits_rank, args=(2, _free_port(), paths, out), nprocs=2,
                                          start_method="spawn")
    parts = [torch.load(f"{out}.{r}") for r in range(2)]
    ids = torch.tensor([[3, 5, 7, 9, 11, 13, 2, 4]])
    for name, path in paths.items():
        with torch.inference_mode():
            ref = LLM(path).model(ids, torch.arange(ids.shape[1])[None])
        for p in parts:
            torch.testing.assert_close(p[name]["whole"], ref, rtol=LOGIT_TOL, atol=LOGIT_TOL)
        local = torch.cat([p[name]["local"] for p in parts], -1)
        assert local.shape == ref.shape, name
        torch.testing.assert_close(local, ref, rtol=LOGIT_TOL, atol=LOGIT_TOL)


def test_server_over_two_ranks():
    """The OpenAI server over a tensor-parallel embedded model: concurrent streamed and plain
    completions equal the one-process offline text; a rank killed afterwards gives an
    OpenAI-shaped error, not a hang."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    from concurrent.futures import ThreadPoolExecutor

    from test_server import Server

    prompts = ["copy : red 4 owl", "sort : 7 4 0", "reverse : sun 3 cat tree"]
    one = LLM("default")
    want = [one.generate([p], one.default_params(gen_length=16)).results[0].text for p in prompts]
    two = LLM("default", tensor_parallel=2)
    server = Server(two, served_model_name="default")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)

        def ask(i):
            if i % 2:
                chunks = client.completions.create(model="default", prompt=prompts[i], max_tokens=16, stream=True)
                return "".join(c.choices[0].text for c in chunks if c.choices)
            return client.completions.create(model="default", prompt=prompts[i], max_tokens=16).choices[0].text

        with ThreadPoolExecutor(3) as pool:
            assert list(pool.map(ask, range(3))) == want
        two.ranks.procs[0].kill()
        with pytest.raises(openai.APIError):
            client.completions.create(model="default", prompt=prompts[0], max_tokens=16)
    finally:
        server.stop()
        two.close()


def test_cli_and_torchrun_launches(tmp_path):
    """`unmask generate --tensor-parallel 2` (unmask spawns rank 1) and the same under torchrun
    (torchrun starts both ranks; rank 1 serves rank 0 and exits quietly) print the one-process text."""
    import subprocess
    import sys

    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}
    base = ["generate", "copy : red 4 owl", "--gen-length", "16", "--json"]

    def text(cmd):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        import json

        rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        return [(r["generated_ids"], r["text"], r["nfe"]) for r in rows]

    r = LLM().generate("copy : red 4 owl", {"gen_length": 16}).results[0]
    one = [([r.token_ids], [r.text], r.nfe)]
    assert text([sys.executable, "-m", "unmask", *base, "--tensor-parallel", "2"]) == one
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                str(_free_port()), "-m", "unmask", *base, "--tensor-parallel", "2"]
    assert text(torchrun) == one


def test_prefix_cache_in_lockstep():
    """The AR twin at N = 2 with its prefix cache: requests sharing a prompt prefix, joining a
    running batch, reuse it on every rank (each rank's pool holds its own heads' pages and makes
    the same decisions) and write what one rank writes without the cache."""
    from unmask.engine import EngineConfig

    shared = "copy : red 4 owl json : name bob age 3 4 city rome sort : 7 4 0 9 pick hand red cat sun :"
    prompts = [f"{shared} copy : {t}" for t in ("red 4 owl", "blue cat", "sun 3 9", "7 4 0 9")]
    one = LLM("default-ar")
    ids = one.encode(prompts, chat=False)
    alone = [one.generate([p], {"gen_length": 12}).results[0].token_ids for p in ids]
    with LLM("default-ar", tensor_parallel=2) as two:
        eng = two.engine(EngineConfig(max_num_seqs=4, prefix_cache_mb=64))
        p = two.default_params(gen_length=12)
        reqs = [eng.add_request(ids[0], p)]
        eng.step()
        eng.step()
        reqs += [eng.add_request(q, p) for q in ids[1:]]
        while eng.has_unfinished():
            eng.step()
        got = [two.result_of(r.canvas, r.nfe, r.commits, 0.0).token_ids for r in reqs]
        assert got == alone
        assert all(r.cached_tokens > 0 for r in reqs[1:]) and eng.prefix_cache.stats.hits > 0
