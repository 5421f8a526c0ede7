"""Speculative rows in the request engine (issue 24): DFlash drafting with batched verification.
The engine's output is the target's (greedy: token for token; sampled: its distribution), it
equals the one-request reference loop (reference/dflash.py, itself tested against z-lab's
release) token for token and in accepted lengths under continuous batching, a request's output
does not depend on what else runs, and the drafter's layout, the loader's checks, the CLI, the
server and the training run (`unmask train --kind dflash`) work end to end."""

import json
import subprocess
import sys

import pytest
import torch

from test_dflash import _chi2_pvalue, _random_drafter, write_drafter, write_qwen3_target
from unmask import LLM, GenerationParams
from unmask.engine import Engine, EngineConfig
from unmask.errors import CheckpointError, UnmaskError
from unmask.models.base import TokenIds
from unmask.models.loader import load_drafter, load_model
from unmask.reference.dflash import autoregressive, speculate

PROMPTS = ["copy : red 4 owl", "sort : 7 4 0", "reverse : sun 3 cat tree", "json : name bob age 3 4 city rome",
           "add 0 6 5 + 0 8 5 =", "copy : 1 dog tree bee black red blue"]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    """A tiny Qwen3 target whose head says only 0, 7 or 9, and a random drafter for it: blocks are
    accepted whole, cut, or rejected, so both caches roll back often."""
    d = tmp_path_factory.mktemp("qwen3")
    write_qwen3_target(d / "t", seed=0, scale=1.0)
    write_drafter(d / "d", layers=2, target_layers=6, block=4)
    target, _ = load_model(d / "t")
    drafter, _ = load_drafter(d / "d")
    return target, drafter, TokenIds(mask=63, eos=0, pad=1, stop=(0,)), d


def _run(engine, prompts, params, stagger: int = 0):
    """Add the prompts (one more every `stagger` steps, else all at once), step until done."""
    reqs, pending = [], list(prompts)
    while pending or engine.has_unfinished():
        if pending and (not stagger or not reqs or engine.num_running == 0 or len(engine.trace) % stagger == 0):
            reqs.append(engine.add_request(pending.pop(0), params))
            if not stagger:
                continue
        engine.step()
    return reqs


def test_engine_equals_the_reference_loop_under_continuous_batching(qwen3):
    """Rows join at different steps, finish at different steps; each request's tokens and accepted
    lengths equal the one-request loop's, and its output is the target's greedy output."""
    target, drafter, ids, _ = qwen3
    prompts = [[3, 9, 14, 2, 7], [5, 5, 5], [60, 1, 33, 12, 40, 8, 8], [2], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]]
    params = GenerationParams(gen_length=30)
    engine = Engine(target, ids, EngineConfig(), drafter=drafter)
    reqs = _run(engine, prompts, params, stagger=3)
    seen = set()
    for q, p in zip(reqs, prompts):
        ref = speculate(target, drafter, p, 30, ids.stop)
        assert q.canvas == ref.tokens == autoregressive(target, p, 30, ids.stop)
        # the release runs one more verify once the last position is filled; the engine stops there
        rounds = len(q.commits) - 1
        assert q.commits == [1] + ref.accepted[:rounds] and len(ref.accepted) - rounds in (0, 1)
        assert q.stats.draft_forwards == rounds and q.stats.drafted == 3 * rounds
        assert q.stats.accepted == sum(a - 1 for a in ref.accepted[:rounds])
        seen |= set(ref.accepted[:rounds])
    assert {1, 4} <= seen and len(seen) >= 3  # rejected, whole and cut blocks all occurred
    kinds = {r.kind for r in engine.trace}
    assert kinds == {"full", "draft", "verify"}


def test_batch_invariance_and_abort(qwen3):
    """A request's output alone equals its output beside others (greedy and seeded sampling), and
    aborting one row leaves the others' outputs unchanged."""
    target, drafter, ids, _ = qwen3
    prompts = [[3, 9, 14, 2, 7], [5, 5, 5], [60, 1, 33, 12, 40, 8, 8], [7, 7]]
    for params in (GenerationParams(gen_length=20), GenerationParams(gen_length=20, temperature=0.8, seed=5)):
        alone = [_run(Engine(target, ids, drafter=drafter), [p], params)[0].canvas for p in prompts]
        engine = Engine(target, ids, drafter=drafter)
        reqs = [engine.add_request(p, params) for p in prompts]
        extra = engine.add_request([9, 9, 9, 9], params)
        engine.step()
        engine.step()
        assert engine.abort(extra.id) and extra.finish_reason == "abort"
        while engine.has_unfinished():
            engine.step()
        assert [q.canvas for q in reqs] == alone


def test_sampled_engine_follows_the_targets_distribution(qwen3):
    """At temperature 1, the first two tokens of 400 unseeded engine samples (drafts accepted and
    rejected) against 400 of the target's own sampling: a chi-square test of homogeneity."""
    target, drafter, ids, _ = qwen3
    prompt = [3, 9, 14, 2, 7]
    torch.manual_seed(0)
    engine = Engine(target, TokenIds(mask=63, eos=62, pad=1, stop=(62,)), EngineConfig(max_num_seqs=400), drafter=drafter)
    reqs = [engine.add_request(prompt, GenerationParams(gen_length=4, temperature=1.0)) for _ in range(400)]
    while engine.has_unfinished():
        engine.step()
    spec = [tuple(q.canvas[:2]) for q in reqs]
    assert sum(q.stats.accepted for q in reqs) > 0  # drafts were accepted
    plain = []
    g = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for _ in range(400):
            x = torch.tensor([prompt])
            out = []
            for _ in range(2):
                logits = target(x, torch.arange(x.shape[1])[None])[0, -1]
                t = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=g))
                out.append(t)
                x = torch.cat([x, torch.tensor([[t]])], 1)
            plain.append(tuple(out))
    keys = sorted(set(spec) | set(plain))
    table = [[spec.count(k) for k in keys], [plain.count(k) for k in keys]]
    assert _chi2_pvalue(table) > 0.001, table


def test_llm_draft_is_lossless_on_the_ar_twin(embedded_ar):
    """LLM(default-ar, draft=...) with a random drafter: the AR twin's greedy output for every
    prompt, in a batch; nfe counts the target's forwards, draft forwards are reported apart."""
    plain = embedded_ar.generate(PROMPTS, {"gen_length": 24}, chat=False)
    llm = LLM.from_parts(embedded_ar.model, embedded_ar.tokenizer, embedded_ar.token_ids,
                         drafter=_random_drafter(embedded_ar.model, block=4))
    spec = llm.generate(PROMPTS, {"gen_length": 24}, chat=False)
    assert [r.token_ids for r in spec.results] == [r.token_ids for r in plain.results]
    assert spec.draft_forwards >= 1 and all(r.draft_forwards == r.nfe - 1 for r in spec.results)
    with pytest.raises(UnmaskError, match="steps"):  # an AR model's fields only
        llm.generate(PROMPTS[:1], {"gen_length": 24, "steps": 4}, chat=False)


def test_drafter_pairing_is_checked(tmp_path, qwen3, embedded_ar):
    _, _, _, d = qwen3
    with pytest.raises(CheckpointError, match="hidden_size 32 is not the target's 256"):
        LLM("default-ar", draft=d / "d")
    with pytest.raises(CheckpointError, match="diffusion model"):
        LLM("default", draft=d / "d")
    with pytest.raises(UnmaskError, match="tensor_parallel 2"):
        LLM("default-ar", draft=d / "d", tensor_parallel=2)
    with pytest.raises(CheckpointError, match="does not exist"):
        LLM("default-ar", draft=tmp_path / "missing")
    write_drafter(tmp_path / "other", layers=2, target_layers=8, block=4)
    from unmask.models.dflash import check_pair

    other, _ = load_drafter(tmp_path / "other")
    target, _ = load_model(d / "t")
    with pytest.raises(CheckpointError, match="num_target_layers 8 is not the target's 6"):
        check_pair(other.config, target.config)


@pytest.mark.usefixtures("plain_kernel")  # a reference at 1e-5
def test_training_writes_the_release_layout_and_resumes(tmp_path):
    """`unmask train --kind dflash` (a few steps): the checkpoint loads through unmask's loader and
    through z-lab's own DFlashDraftModel with equal hidden states; a run split by --until and
    --resume equals the uninterrupted one; evaluation reports lossless speculation."""
    from reference_dflash import DFlashDraftModel

    from unmask.train.run import train
    from unmask.train.trainer import TrainConfig

    kw = dict(kind="dflash", layers=1, mlp=128, block_length=4, batch=4, steps=4, eval_every=4, eval_n=2,
              anchors=4, target_layers=(1, 3), tasks={"copy": 1.0, "sort": 1.0}, warmup=1)
    whole = train(TrainConfig(**kw), tmp_path / "a", progress=False)
    train(TrainConfig(**kw), tmp_path / "b", progress=False, until=2)
    split = train(TrainConfig(**kw), tmp_path / "b", resume=True, progress=False)
    assert whole["loss"] == pytest.approx(split["loss"], rel=1e-5)
    ev = whole["history"]["held_out_exact"]
    assert set(ev) == {"copy", "sort"} and all(v["lossless"] == 1.0 and v["accepted"] >= 1 for v in ev.values())
    ours, cfg = load_drafter(tmp_path / "a" / "model")
    assert cfg["dflash_config"]["target_layer_ids"] == [1, 3] and ours.config.block_size == 4
    ref = DFlashDraftModel.from_pretrained(tmp_path / "a" / "model").eval()
    torch.manual_seed(0)
    noise, ctx = torch.randn(1, 4, 256), torch.randn(1, 5, 512)
    pos = torch.arange(9)[None]
    with torch.no_grad():
        want = ref(position_ids=pos, noise_embedding=noise, target_hidden=ctx, use_cache=False)
        got = ours(noise, ctx, pos)
    assert torch.allclose(got, want, atol=1e-5)
    with pytest.raises(UnmaskError, match="autoregressive"):
        train(TrainConfig(**{**kw, "target": "default"}), tmp_path / "c", progress=False)
    assert not (tmp_path / "c").exists()


def test_cli_generate_with_a_draft(tmp_path, embedded_ar):
    """`unmask generate --model default-ar --draft PATH --json`: the AR twin's tokens, the drafter's
    forwards reported."""
    from unmask.train.dflash import DraftTrainee, save
    from unmask.train.data import build_tokenizer

    save(DraftTrainee(_random_drafter(embedded_ar.model, block=4), embedded_ar.model), build_tokenizer(),
         tmp_path / "d", {}, embedded_ar.arch.vocab_size)
    spec = subprocess.run([sys.executable, "-m", "unmask", "generate", "--model", "default-ar", "--json", "--draft",
                           str(tmp_path / "d"), PROMPTS[1]], capture_output=True, text=True, timeout=120)
    assert spec.returncode == 0, spec.stderr
    s = json.loads(spec.stdout)
    want = embedded_ar.generate([PROMPTS[1]], embedded_ar.default_params(), chat=False).results[0].token_ids
    assert s["generated_ids"] == [want] and s["policy"] == "speculative" and s["draft_forwards"] >= 1


def test_server_streams_speculative_rows(embedded_ar):
    """`unmask serve --draft`: completions (plain and streamed, concurrent) equal the AR twin's
    offline output; usage and /metrics report the drafter's side."""
    import concurrent.futures

    openai = pytest.importorskip("openai")
    httpx = pytest.importorskip("httpx")
    from test_server import Server

    llm = LLM.from_parts(embedded_ar.model, embedded_ar.tokenizer, embedded_ar.token_ids,
                         drafter=_random_drafter(embedded_ar.model, block=4))
    server = Server(llm, served_model_name="default-ar")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
        want = [r.text for r in embedded_ar.generate(PROMPTS, {"gen_length": 24}, chat=False).results]

        def ask(prompt):
            plain = client.completions.create(model="default-ar", prompt=prompt, max_tokens=24)
            chunks = list(client.completions.create(model="default-ar", prompt=prompt, max_tokens=24, stream=True))
            return plain, "".join(c.choices[0].text for c in chunks if c.choices)

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            got = list(pool.map(ask, PROMPTS))
        for (plain, streamed), text in zip(got, want):
            assert plain.choices[0].text == streamed == text
            extra = plain.usage.model_extra
            assert extra["draft_forwards"] == extra["nfe"] - 1 and extra["draft_tokens"] == 3 * extra["draft_forwards"]
        metrics = httpx.get(server.url + "/metrics").text
        assert "unmask_spec_decode_num_drafts_total" in metrics and "unmask_spec_decode_mean_accepted_length" in metrics
    finally:
        server.stop()


@pytest.mark.slow  # a benchmark run in a subprocess
def test_bench_reports_dflash_beside_the_ar_twin(tmp_path, embedded_ar):
    """`unmask bench --draft`: a DFlash row per batch, with the AR twin's accuracy (lossless) and
    the target's forwards per request at most the AR twin's."""
    from unmask.train.data import build_tokenizer
    from unmask.train.dflash import DraftTrainee, save

    save(DraftTrainee(_random_drafter(embedded_ar.model, block=4), embedded_ar.model), build_tokenizer(),
         tmp_path / "d", {}, embedded_ar.arch.vocab_size)
    out = subprocess.run([sys.executable, "-m", "unmask", "bench", "--policies", "fixed:1", "--caches", "none",
                          "--blocks", "24", "--batches", "1,2", "--n", "2", "--tasks", "sort", "--draft",
                          str(tmp_path / "d"), "--out", str(tmp_path / "b"), "--quiet"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    run = json.loads(next((tmp_path / "b").glob("bench-*.json")).read_text())
    rows = {r["label"]: r for r in run["results"]}
    for b in (1, 2):
        ar, df = rows[f"AR twin b{b}"], rows[f"DFlash b{b}"]
        assert df["accuracy"] == ar["accuracy"] and df["nfe_per_request"] <= ar["nfe_per_request"]
    assert run["draft_model"] == str(tmp_path / "d")
    assert any(h["role"] == "DFlash" for h in run["headline"])


def test_roofline_prices_speculative_decoding():
    from unmask.bench import roofline as rl
    from unmask.bench import shapes
    from unmask.bench import roofline_tables as rt

    arch = shapes.dense_shape("qwen3-8b")
    target = rl.build("h200", arch, None, None, True)
    draft = rl.Roofline(target.hw, rt.draft_cost(arch, 5, 5, 2.0))
    t = rt.speculative_table(target, draft, 512, 16, (1.0, 4.0), (1, 64))
    one, four = [r for r in t["rows"] if r["batch"] == 1]
    assert one["speedup"] < 1 < four["speedup"] and four["speedup"] == pytest.approx(4 * one["speedup"])
    assert max(r["speedup"] for r in t["rows"] if r["batch"] == 64) < four["speedup"]  # compute-bound verifies
    bad = subprocess.run([sys.executable, "-m", "unmask", "roofline", "--draft-layers", "5"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode != 0 and "--draft-layers 5 needs --model" in bad.stderr


def test_llm_loads_a_qwen3_target_with_a_released_layout_drafter(qwen3):
    """The published pairing through the front end: a transformers-saved Qwen3ForCausalLM folder
    (no mask token of its own) with a drafter in z-lab's layout (its dflash_config names the mask
    id): LLM(target, draft=drafter) decodes what the one-request loop decodes."""
    from tokenizers import Tokenizer, models

    _, _, _, d = qwen3
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(64)}, unk_token="w1"))
    tok.save(str(d / "t" / "tokenizer.json"))
    (d / "t" / "tokenizer_config.json").write_text(json.dumps({"eos_token": "w62", "pad_token": "w1"}))
    llm = LLM(d / "t", draft=d / "d")
    assert llm.token_ids.mask == 63 and llm.token_ids.eos == 62  # the head never says 62: outputs run to length
    prompts = [[3, 9, 14, 2, 7], [60, 1, 33, 12, 40, 8, 8]]
    out = llm.generate(prompts, {"gen_length": 30})
    for p, r in zip(prompts, out.results):
        ref = speculate(llm.model, llm.drafter, p, 30, llm.token_ids.stop)
        assert r.raw_ids == ref.tokens and len(r.raw_ids) == 30 and r.draft_forwards >= 1


def test_the_shipped_drafter_reproduces_its_record(embedded_ar):
    """default-dflash on the first 200 held-out examples of two tasks: the AR twin's outputs,
    all identical, and the tau its eval.json records (scripts/ship_default.py --dflash)."""
    from unmask.evaluate import run_task
    from unmask.loading import EMBEDDED

    record = {r["task"]: r for r in json.loads((EMBEDDED["default-dflash"] / "eval.json").read_text())["results"]}
    spec = LLM.from_parts(embedded_ar.model, embedded_ar.tokenizer, embedded_ar.token_ids,
                          drafter=load_drafter(EMBEDDED["default-dflash"])[0])
    params = embedded_ar.default_params(gen_length=24)
    for task in ("json", "arith"):
        a, d = run_task(embedded_ar, task, 200, params, 100), run_task(spec, task, 200, params, 100)
        res = [r for o in d.outputs for r in o.results]
        assert [r.token_ids for o in a.outputs for r in o.results] == [r.token_ids for r in res]
        tau = sum(r.num_tokens - 1 for r in res if r.nfe > 1) / sum(r.nfe - 1 for r in res)
        assert record[task]["identical"] == 200 and tau == pytest.approx(record[task]["tau"], rel=1e-9)
        assert tau > 3  # the drafter is trained: blocks are accepted


def test_token_budget_applies_to_speculative_rows(qwen3):
    """With a budget that fits one row's prefill or block at a time, the rows take turns (the
    first always runs), and each request's tokens are what it decodes alone."""
    target, drafter, ids, _ = qwen3
    prompts = [[3, 9, 14, 2, 7], [5, 5, 5], [60, 1, 33, 12, 40, 8, 8]]
    params = GenerationParams(gen_length=12)
    alone = [_run(Engine(target, ids, drafter=drafter), [p], params)[0].canvas for p in prompts]
    engine = Engine(target, ids, EngineConfig(max_num_batched_tokens=20), drafter=drafter)
    reqs = [engine.add_request(p, params) for p in prompts]
    ran = []
    while engine.has_unfinished():
        ran.append(len(engine.step()))
    assert max(ran) < len(prompts)  # never every row in one step
    assert [q.canvas for q in reqs] == alone
    assert all(r.rows < len(prompts) for r in engine.trace)
