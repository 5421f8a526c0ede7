"""Block-diffusion models: attention by blocks of positions, the exact block cache (a prefill, the
open block each step, the seal forward fused with the next block's first step), the three
checkpoint layouts, and the block-diffusion training objective."""

import json

import pytest
import torch

from checkpoints import write_fast_dllm_v2, write_llada, write_llada_block, write_sdar
from unmask import LLM
from unmask.errors import CheckpointError, UnmaskError
from unmask.params import GenerationParams

LAYOUTS = {"llada-block": write_llada_block, "fast-dllm-v2": write_fast_dllm_v2, "sdar": write_sdar}
PROMPTS = [[3, 4, 5], [6, 7, 8, 9, 10, 11, 12], [1, 2, 20, 21, 22, 23, 24, 25, 26, 27, 28], [30, 31, 32, 33]]


@pytest.fixture(scope="module", params=list(LAYOUTS))
def block_llm(request, tmp_path_factory):
    return LLM(LAYOUTS[request.param](tmp_path_factory.mktemp(request.param)))


def _params(llm, **kw):
    kw.setdefault("gen_length", 16)
    return GenerationParams(block_length=llm.arch.block_size, **kw)


POLICIES = [dict(steps=16), dict(steps=8), dict(policy="threshold", threshold=0.5), dict(policy="factor", factor=1.0),
            dict(policy="entropy", gamma=0.5), dict(policy="budget", budget=0.5)]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: "-".join(f"{k}{v}" for k, v in p.items()))
def test_exact_cache_gives_the_tokens_of_no_cache(block_llm, policy):
    none = block_llm.generate(PROMPTS, _params(block_llm, cache="none", **policy))
    exact = block_llm.generate(PROMPTS, _params(block_llm, cache="exact", **policy))
    assert [r.token_ids for r in exact.results] == [r.token_ids for r in none.results]
    assert [r.nfe for r in exact.results] == [r.nfe for r in none.results]
    assert {s.kind for s in none.steps} == {"full"}
    assert exact.steps[0].kind == "full" and all(s.kind != "full" for s in exact.steps[1:])


def test_a_row_alone_equals_the_row_in_a_batch(block_llm):
    p = _params(block_llm, cache="exact", policy="threshold", threshold=0.5)
    batch = block_llm.generate(PROMPTS, p).results
    for prompt, row in zip(PROMPTS, batch):
        assert block_llm.generate([prompt], p).results[0].token_ids == row.token_ids


def _reference_decode(model, prompt, mask_id, block, gen_length, shift):
    """Batch 1, no cache, one token per step, most confident first, written from the rule alone:
    blocks are positions [kB, (k+1)B), attention is "key block <= query block", built here as an
    explicit matrix; a position's logits come from the hidden state `shift` columns before it."""
    x = torch.tensor(prompt + [mask_id] * gen_length)[None]
    L, P = x.shape[1], len(prompt)
    pos = torch.arange(L)[None]
    allowed = (pos[0][None, :] // block <= pos[0][:, None] // block)[None, None]
    start = P
    while start < L:
        end = min((start // block + 1) * block, L)
        while bool((x[0, start:end] == mask_id).any()):
            logits = model(x, pos, attn_mask=allowed)[0]
            cols = torch.arange(start, end)
            p = torch.softmax(logits[cols - shift].double(), -1)
            conf, tok = p.max(-1)
            conf = torch.where(x[0, start:end] == mask_id, conf, -1.0)
            j = int(conf.argmax())
            x[0, start + j] = tok[j]
        start = end
    return x[0, P:].tolist()


def test_engine_matches_a_reference_written_from_the_block_rule(block_llm):
    arch = block_llm.arch
    g = 2 * arch.block_size
    for prompt in PROMPTS[:3]:
        want = _reference_decode(block_llm.model, prompt, block_llm.token_ids.mask, arch.block_size, g, arch.logit_shift)
        got = block_llm.generate([prompt], _params(block_llm, gen_length=g, steps=g, cache="exact",
                                                   early_stop=False)).results[0]
        assert got.token_ids == want[: len(got.token_ids)]


def test_later_blocks_do_not_change_earlier_logits(block_llm):
    m, B = block_llm.model, block_llm.arch.block_size
    x = torch.randint(0, 50, (1, 4 * B))
    pos = torch.arange(4 * B)[None]
    y = x.clone()
    y[0, 2 * B :] = torch.randint(0, 50, (2 * B,))
    with torch.no_grad():
        a, b = m(x, pos), m(y, pos)
    assert torch.equal(a[:, : 2 * B], b[:, : 2 * B])
    assert not torch.allclose(a[:, 2 * B :], b[:, 2 * B :])


def test_the_denoising_step_computes_only_the_open_block_whatever_the_prompt(block_llm):
    B = block_llm.arch.block_size
    for n in (5, 40):
        prompt = [i % 50 for i in range(n)]
        out = block_llm.generate([prompt], _params(block_llm, gen_length=4 * B, steps=4 * B, cache="exact",
                                                   early_stop=False))
        kinds = [s.kind for s in out.steps]
        assert kinds[0] == "full" and out.steps[0].positions == (n // B + 1) * B  # the prompt and first block
        shift = block_llm.arch.logit_shift
        assert all(s.positions <= B + shift for s in out.steps if s.kind == "window")
        assert all(s.positions <= 2 * B for s in out.steps if s.kind == "seal")
        # one seal forward per block boundary crossed after the first block
        first_end = (n // B + 1) * B
        assert kinds.count("seal") == -(-(n + 4 * B - first_end) // B)
        assert out.results[0].seal_forwards == kinds.count("seal")


def test_block_models_refuse_other_blocks_and_approximate_caches(block_llm):
    B = block_llm.arch.block_size
    with pytest.raises(UnmaskError, match=f"block_length {2 * B}.*use block_length {B}"):
        block_llm.generate([[3, 4]], GenerationParams(gen_length=4 * B, block_length=2 * B, cache="exact"))
    for cache in ("dual", "prefix"):
        with pytest.raises(UnmaskError, match=f"cache '{cache}'.*exact"):
            block_llm.generate([[3, 4]], _params(block_llm, cache=cache))
    assert block_llm.default_params().cache == "exact" and block_llm.default_params().block_length == B


def test_exact_cache_is_refused_for_full_attention_models(llada):
    with pytest.raises(UnmaskError, match="cache 'exact' is exact only for block-diffusion models"):
        llada.generate([[3, 4]], GenerationParams(gen_length=8, block_length=8, cache="exact"))


def test_early_stop_ends_a_row_at_its_end_of_text(block_llm, monkeypatch):
    eos, model = block_llm.token_ids.eos, block_llm.model
    forward = model.forward

    def eos_everywhere(*a, **kw):  # every position proposes end of text, with certainty
        logits = forward(*a, **kw)
        logits[..., eos] += 100.0
        return logits

    monkeypatch.setattr(model, "forward", eos_everywhere)
    out = block_llm.generate(PROMPTS[:2], _params(block_llm, gen_length=32, cache="exact", policy="threshold",
                                                  threshold=0.5))
    for r in out.results:  # the first block commits at once, and the row stops there
        assert r.finish_reason == "stop" and r.nfe == 1 and r.token_ids == []


def test_checkpoint_layouts_are_read_strictly(tmp_path):
    f = write_fast_dllm_v2(tmp_path / "v2")
    cfg = json.loads((f / "config.json").read_text())
    for bad, msg in ((dict(bd_size=None), "lacks required field 'bd_size'"), (dict(bd_size=0), "bd_size 0"),
                     (dict(bd_size=2.5), "bd_size 2.5 must be an integer"),
                     (dict(rope_scaling={"type": "yarn"}), "rope_scaling"),
                     (dict(use_sliding_window=True), "use_sliding_window")):
        (f / "config.json").write_text(json.dumps({**cfg, **bad}))
        with pytest.raises(CheckpointError, match=msg):
            LLM(f)
    s = write_sdar(tmp_path / "sdar")
    assert LLM(s).arch.block_size == 4  # SDAR's released decoding block, its config has none
    index = json.loads((s / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if "q_norm" not in k}
    (s / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="q_norm"):
        LLM(s)
    s2 = write_sdar(tmp_path / "sdar8", bd_size=8)
    assert LLM(s2).arch.block_size == 8
    lb = write_llada(tmp_path / "both")
    c = json.loads((lb / "config.json").read_text())
    (lb / "config.json").write_text(json.dumps({**c, "bd_size": 4, "causal": True}))
    with pytest.raises(CheckpointError, match="either causal or a block-diffusion model"):
        LLM(lb)


def test_training_mask_clean_half_is_the_models_own_block_forward(tmp_path):
    from unmask.train.data import build_tokenizer, make_batch
    from unmask.train.trainer import TrainConfig, arch_for, block_attention
    from unmask.models.llada import LLaDAModel
    from unmask.tasks import held_out

    tok = build_tokenizer()
    torch.manual_seed(0)
    cfg = TrainConfig(kind="block", block_length=4, layers=2, d_model=32, heads=2, mlp=64, gen_length=24).check()
    m = LLaDAModel(arch_for(cfg, tok.get_vocab_size())).eval()
    b = make_batch(held_out("copy", 3) + held_out("word", 2), tok, 24)
    n = b.ids.shape[1]
    mask = block_attention(b.positions, b.key_mask, 4)
    noisy = b.ids.clone()
    noisy[:, b.prompt_len :] = tok.token_to_id("<|mdm_mask|>")
    with torch.no_grad():
        both = m(torch.cat([noisy, b.ids], 1), torch.cat([b.positions, b.positions], 1), attn_mask=mask)
        own = m(b.ids, b.positions, key_mask=b.key_mask)
        other = b.ids.clone()
        other[:, b.prompt_len :] = 7  # the clean half never sees the noisy half, whatever it holds
        both2 = m(torch.cat([other, b.ids], 1), torch.cat([b.positions, b.positions], 1), attn_mask=mask)
    real = b.key_mask if b.key_mask is not None else torch.ones_like(b.ids, dtype=torch.bool)
    assert (both[:, n:] - own)[real].abs().max() < 1e-4
    assert torch.equal(both2[:, n:], both[:, n:])
    blk = b.positions // 4
    m4 = mask[:, 0]
    # a noisy query sees its own noisy block and strictly earlier clean blocks only
    for r in range(b.ids.shape[0]):
        for q in range(n):
            if not real[r, q]:
                continue
            noisy_keys = m4[r, q, :n].nonzero().squeeze(-1)
            clean_keys = m4[r, q, n:].nonzero().squeeze(-1)
            assert (blk[r, noisy_keys] == blk[r, q]).all()
            assert (blk[r, clean_keys] < blk[r, q]).all()
            assert not m4[r, n + q, :n].any()


@pytest.mark.parametrize("policy", POLICIES[:3], ids=lambda p: "-".join(f"{k}{v}" for k, v in p.items()))
def test_sub_blocks_decode_left_to_right_with_the_tokens_of_no_cache(block_llm, policy):
    B = block_llm.arch.block_size
    sub = B // 2
    p = dict(gen_length=16, block_length=sub, **policy)
    none = block_llm.generate(PROMPTS, GenerationParams(cache="none", **p))
    exact = block_llm.generate(PROMPTS, GenerationParams(cache="exact", **p))
    assert [r.token_ids for r in exact.results] == [r.token_ids for r in none.results]
    # a sub-block is filled before the next one opens: every commit lies in the open sub-block
    eng = block_llm.engine()
    req = eng.add_request(PROMPTS[1], GenerationParams(cache="exact", early_stop=False, **p), watch=True)
    P, last = len(PROMPTS[1]), None
    while eng.has_unfinished():
        for out in eng.step():
            canvas = out.canvas
            if last is not None:
                changed = [j for j, (a, b) in enumerate(zip(last, canvas)) if a != b]
                subs = {(P + j) // sub for j in changed}
                assert len(subs) == 1
                first_open = next(j for j, t in enumerate(last) if t == block_llm.token_ids.mask)
                assert subs == {(P + first_open) // sub}
            last = canvas
    assert req.done and last is not None


def test_exact_dual_caches_the_open_block_between_sub_blocks(block_llm):
    B, shift = block_llm.arch.block_size, block_llm.arch.logit_shift
    whole = dict(gen_length=2 * B, block_length=B, steps=2 * B)
    exact = block_llm.generate(PROMPTS, GenerationParams(cache="exact", **whole))
    dual = block_llm.generate(PROMPTS, GenerationParams(cache="exact-dual", **whole))
    assert [r.token_ids for r in dual.results] == [r.token_ids for r in exact.results]  # no sub-blocks: the same
    sub = B // 2
    out = block_llm.generate([[5] * 9], GenerationParams(cache="exact-dual", gen_length=2 * B, block_length=sub,
                                                         steps=2 * B, early_stop=False))
    windows = [s.positions for s in out.steps if s.kind == "window"]
    assert windows and max(windows) <= B  # whole-block steps at each sub-block's start ...
    assert min(windows) <= sub + shift  # ... and sub-block steps between them
    assert len(out.results[0].token_ids) + (out.results[0].finish_reason == "stop") <= 2 * B


def test_block_length_must_divide_the_models_block(block_llm):
    B = block_llm.arch.block_size
    with pytest.raises(UnmaskError, match=f"block_length 3.*blocks of {B}.*divisor"):
        block_llm.generate([[3, 4]], GenerationParams(gen_length=6, block_length=3))


# --------------------------------------------------------------- compat fast-dllm-v2

@pytest.fixture(scope="module")
def v2_dir(tmp_path_factory):
    """A Fast-dLLM v2 checkpoint whose stop token is often the argmax, so that rows finish at
    different blocks (seed and weights chosen for that)."""
    from safetensors.torch import load_file, save_file

    folder = write_fast_dllm_v2(tmp_path_factory.mktemp("v2stop"), bd_size=8, seed=2)
    stop = LLM(folder).token_ids.eos
    for shard in folder.glob("*.safetensors"):
        t = load_file(str(shard))
        if "lm_head.weight" in t:
            t["lm_head.weight"][stop] += t["lm_head.weight"][15]
            save_file(t, str(shard), metadata={"format": "pt"})
    return folder


V2_PROMPTS = {
    # shortest prompt below one block (no prefill); rows whose prompts run past the first blocks
    "short": [[3, 4, 5], [6, 7, 8, 9, 10, 11, 12, 13, 14, 15], list(range(1, 19)), [20, 21, 22, 23, 24],
              list(range(30, 42))],
    # shortest prompt two blocks long: prefill, and its last logit proposes those rows' next token
    "aligned": [list(range(10, 26)), list(range(1, 22)), list(range(5, 21))],
    "unaligned": [list(range(10, 29)), list(range(1, 12))],
    # upstream's width quirks: prompts filling the first block while a shorter row is still in it
    # (they take the seal forward's next token), and a longest prompt one token past a block
    # (upstream's `input_ids = x_t` overwrites that prompt token with the seal forward's token)
    "boundary": [list(range(1, 9)), [3, 4, 5, 6, 7, 8], list(range(20, 28))],
    "one-past": [list(range(1, 10)), [3, 4, 5]],
}


@pytest.mark.parametrize("prompts", list(V2_PROMPTS))
@pytest.mark.parametrize("sub,cache,threshold", [(8, "exact", 0.9), (8, "exact", 1.0), (4, "exact", 0.5),
                                                  (4, "exact-dual", 0.9), (4, "exact-dual", 1.0), (2, "exact-dual", 0.7)])
def test_compat_fast_dllm_v2_is_token_exact_against_the_reference_port(v2_dir, prompts, sub, cache, threshold):
    from reference import QwenBlockRef, fast_dllm_v2_batch_sample

    llm = LLM(v2_dir)
    ids, batch = llm.token_ids, V2_PROMPTS[prompts]
    out = llm.generate(batch, GenerationParams(compat="fast-dllm-v2", gen_length=24, block_length=sub,
                                               threshold=threshold, cache=cache))
    inp = torch.full((len(batch), max(map(len, batch))), ids.mask)
    for r, p in enumerate(batch):
        inp[r, : len(p)] = torch.tensor(p)
    with torch.no_grad():
        rows, nfe = fast_dllm_v2_batch_sample(QwenBlockRef(v2_dir), inp, torch.tensor([len(p) for p in batch]), 8, 24,
                                              sub, ids.mask, threshold, ids.eos, ids.pad, cache == "exact-dual")
    assert [r.raw_ids for r in out.results] == [row[len(p):] for row, p in zip(rows, batch)]
    assert [r.nfe for r in out.results] == nfe
    if cache == "exact-dual" and sub < 8:
        assert any(s.positions == sub for s in out.steps)  # sub-block forwards against the block cache


def test_compat_fast_dllm_v2_rows_finish_at_different_blocks(v2_dir):
    out = LLM(v2_dir).generate(V2_PROMPTS["short"], GenerationParams(compat="fast-dllm-v2", gen_length=24,
                                                                     block_length=4, threshold=1.0))
    assert len({r.nfe for r in out.results}) > 2  # the stop handling above was exercised
    assert {"stop"} <= {r.finish_reason for r in out.results}


def test_compat_fast_dllm_v2_refuses_what_it_does_not_reproduce(v2_dir, llada):
    llm = LLM(v2_dir)
    for p, msg in ((dict(temperature=0.5), "temperature"), (dict(steps=24), "steps"),
                   (dict(cache="dual"), "cache 'dual'"), (dict(gen_length=4, block_length=4), "at least the block")):
        with pytest.raises(UnmaskError, match=msg):
            llm.generate([[3, 4, 5]], GenerationParams(compat="fast-dllm-v2", **{"gen_length": 16, "block_length": 4, **p}))
    with pytest.raises(UnmaskError, match="exactly one block"):
        llm.generate([list(range(8)), list(range(12))], GenerationParams(compat="fast-dllm-v2", gen_length=16,
                                                                         block_length=4))
    with pytest.raises(UnmaskError, match="fast_dllm_v2|Fast-dLLM v2"):
        llada.generate([[3, 4]], GenerationParams(compat="fast-dllm-v2", gen_length=32, block_length=4))


def test_released_decoding_defaults_of_each_family(tmp_path):
    sdar = LLM(write_sdar(tmp_path / "sdar")).default_params()
    assert (sdar.policy, sdar.threshold, sdar.block_length, sdar.cache) == ("threshold", 0.85, 4, "exact")
    v2 = LLM(write_fast_dllm_v2(tmp_path / "v2", bd_size=32)).default_params()
    assert (v2.policy, v2.threshold, v2.block_length, v2.cache) == ("threshold", 0.9, 8, "exact")  # sub-blocks of 8
    v2small = LLM(write_fast_dllm_v2(tmp_path / "v2s", bd_size=4)).default_params()
    assert v2small.block_length == 4  # a sub-block of 8 does not divide a block of 4


def test_the_canvas_need_not_tile_a_block_models_blocks(block_llm):
    B = block_llm.arch.block_size
    g = 2 * B + 3  # ends in a partial block
    for policy in (dict(), dict(policy="threshold", threshold=0.5)):
        none = block_llm.generate(PROMPTS, block_llm.default_params(gen_length=g, cache="none", early_stop=False, **policy))
        exact = block_llm.generate(PROMPTS, block_llm.default_params(gen_length=g, cache="exact", early_stop=False,
                                                                     **policy))
        assert [r.raw_ids for r in exact.results] == [r.raw_ids for r in none.results]
        assert all(len(r.raw_ids) == g and block_llm.token_ids.mask not in r.raw_ids for r in exact.results)
    # the fixed schedule commits gen_length / steps tokens per step, also in partial blocks
    out = block_llm.generate([[5] * 8], block_llm.default_params(gen_length=g - 1, steps=(g - 1) // 2, early_stop=False))
    assert all(n <= 2 for n in out.results[0].commits)
    with pytest.raises(UnmaskError, match="steps must divide gen_length"):
        block_llm.default_params(gen_length=g, steps=4)
