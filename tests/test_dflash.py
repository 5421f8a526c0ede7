"""The DFlash drafter (issue 24, first part): unmask's port loads the released layout (written by
z-lab's own DFlashDraftModel through transformers' save_pretrained) and computes the reference's
hidden states, with its KV cache of context positions across blocks and a crop after a
rejection; the loader is strict."""

import json

import pytest
import torch

pytest.importorskip("transformers")
from transformers import DynamicCache, Qwen3Config  # noqa: E402

from reference_dflash import DFlashDraftModel, build_target_layer_ids  # noqa: E402
from unmask.errors import CheckpointError  # noqa: E402
from unmask.kv import DraftCache  # noqa: E402
from unmask.models import dflash  # noqa: E402
from unmask.models.loader import load_drafter  # noqa: E402


def write_drafter(folder, layers=2, target_layers=6, block=4, seed=0, **dflash_cfg):
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
                      max_position_embeddings=256)
    cfg.block_size, cfg.num_target_layers = block, target_layers
    cfg.dflash_config = {"mask_token_id": 63, **dflash_cfg}
    cfg.architectures = ["DFlashDraftModel"]
    model = DFlashDraftModel(cfg).eval()
    with torch.no_grad():  # weights far from the initialiser's near-identity norms
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    model.save_pretrained(folder)
    return model


def write_qwen3_target(folder, seed: int, scale: float):
    """A tiny transformers Qwen3ForCausalLM, saved; its head can only say 0, 7 or 9, so a random
    drafter's blocks are accepted whole, in part, or not at all."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=6, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6, max_position_embeddings=256,
                      tie_word_embeddings=False)
    cfg.architectures = ["Qwen3ForCausalLM"]
    target = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        head = torch.zeros_like(target.lm_head.weight)
        head[[7, 9]] = torch.randn(2, 32) * scale
        target.lm_head.weight.copy_(head)
    target.save_pretrained(folder)
    return target


def _crop(cache, length: int) -> None:
    """DynamicCache.crop(length) as the release calls it (transformers 5 removes -n tokens instead)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def test_target_layer_rule_matches_the_release():
    for t in (6, 28, 36, 64):
        for d in (1, 2, 3, 5, 8):
            assert dflash.build_target_layer_ids(t, d) == build_target_layer_ids(t, d)


@pytest.mark.usefixtures("plain_kernel")  # a reference at 1e-5
def test_drafter_equals_the_reference_across_blocks(tmp_path):
    ref = write_drafter(tmp_path / "d")
    ours, _ = load_drafter(tmp_path / "d")
    assert list(ours.config.target_layer_ids) == list(ref.target_layer_ids)
    n_ctx = len(ref.target_layer_ids) * 32
    g = torch.Generator().manual_seed(1)
    ref_cache, our_cache = DynamicCache(), DraftCache(2)
    start = 0
    for ctx_len in (5, 3, 1):  # a prompt's context, then the accepted tokens of two blocks
        context = torch.randn(2, ctx_len, n_ctx, generator=g)
        noise = torch.randn(2, 4, 32, generator=g)
        pos = torch.arange(start, start + ctx_len + 4)[None].expand(2, -1)
        with torch.inference_mode():
            want = ref(target_hidden=context, noise_embedding=noise, position_ids=pos, past_key_values=ref_cache,
                       use_cache=True, is_causal=False)
            got = ours(noise, context, pos, our_cache)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        start += ctx_len
        _crop(ref_cache, start)  # the release keeps the context positions only
        assert our_cache.length == start
    our_cache.crop(6)  # a rejection: both caches forget the same positions
    _crop(ref_cache, 6)
    context, noise = torch.randn(2, 2, n_ctx, generator=g), torch.randn(2, 4, 32, generator=g)
    pos = torch.arange(6, 12)[None].expand(2, -1)
    with torch.inference_mode():
        want = ref(target_hidden=context, noise_embedding=noise, position_ids=pos, past_key_values=ref_cache,
                   use_cache=True, is_causal=False)
        torch.testing.assert_close(ours(noise, context, pos, our_cache), want, rtol=1e-5, atol=1e-5)


def test_explicit_target_layers_and_loader_strictness(tmp_path):
    write_drafter(tmp_path / "d", target_layer_ids=[0, 4])
    ours, _ = load_drafter(tmp_path / "d")
    assert ours.config.target_layer_ids == (0, 4) and ours.fc.in_features == 64
    cfg_path = tmp_path / "d" / "config.json"
    good = json.loads(cfg_path.read_text())
    for change, needle in (({"architectures": ["Qwen3ForCausalLM"]}, "not a DFlash drafter"),
                           ({"block_size": 1}, "block_size 1"),
                           ({"dflash_config": {"target_layer_ids": [0, 9]}}, "target_layer_ids"),
                           ({"layer_types": ["sliding_attention", "full_attention"]}, "sliding-window"),
                           ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope"),
                           ({"hidden_size": 40}, "shape")):
        cfg_path.write_text(json.dumps({**good, **change}))
        with pytest.raises(CheckpointError, match=needle):
            load_drafter(tmp_path / "d")
    cfg_path.write_text(json.dumps({**good, "num_hidden_layers": 3}))
    with pytest.raises(CheckpointError, match="missing weights layers.2"):
        load_drafter(tmp_path / "d")
    with pytest.raises(CheckpointError, match="does not exist"):
        load_drafter(tmp_path / "nope")


def _random_drafter(target, layers=2, block=4, seed=0):
    a = target.config
    c = dflash.DraftConfig(a.hidden_size, layers, a.num_heads, a.num_kv_heads, a.head_dim, 2 * a.hidden_size, 1e-6,
                           a.rope_theta, False, block, a.num_layers,
                           tuple(dflash.build_target_layer_ids(a.num_layers, layers)), None)
    torch.manual_seed(seed)
    d = dflash.DFlashDrafter(c)
    with torch.no_grad():
        for p in d.parameters():
            p.copy_(torch.randn_like(p) * 0.1 if p.dim() > 1 else torch.ones_like(p))
    return d.eval()


@pytest.mark.parametrize("block", [2, 4, 8])
def test_greedy_speculation_is_the_targets_greedy_output(embedded_ar, block):
    """Whatever the drafter proposes (here a random one), greedy speculative decoding writes
    exactly the AR twin's greedy tokens; each verify forward yields 1..block tokens."""
    from unmask.reference.dflash import speculate

    llm = embedded_ar
    drafter = _random_drafter(llm.model, block=block)
    prompts = ["copy : red 4 owl", "sort : 7 4 0", "reverse : sun 3 cat tree", "json : name bob age 3 4 city rome"]
    ids = llm.encode(prompts, chat=False)
    plain = llm.generate(ids, {"gen_length": 24})
    for p, want in zip(ids, plain.results):
        got = speculate(llm.model, drafter, p, 24, llm.token_ids.stop, mask_id=llm.token_ids.mask)
        stop = set(llm.token_ids.stop)
        text = got.tokens[:-1] if got.tokens and got.tokens[-1] in stop else got.tokens  # results omit the stop
        assert text == want.token_ids
        assert all(1 <= a <= block for a in got.accepted) and got.target_forwards == len(got.accepted) + 1


def test_speculation_equals_the_release_on_a_qwen3_target(tmp_path, monkeypatch):
    """z-lab's own `dflash_generate` (vendored) with a transformers Qwen3 target against unmask's
    loop over the same checkpoints loaded by unmask: the same tokens and the same accepted lengths,
    greedy. The target's head can only say 0, 7 or 9, so a random drafter's blocks are accepted
    whole, cut, or rejected at once, and the rollbacks of both caches are exercised."""
    import reference_dflash
    from unmask.models.loader import load_model
    from unmask.reference.dflash import speculate

    real_crop = DynamicCache.crop
    monkeypatch.setattr(DynamicCache, "crop", lambda self, n: _crop_with(real_crop, self, n))  # transformers 5
    import time

    monkeypatch.setattr(reference_dflash, "_cuda_time", time.perf_counter)  # its timer synchronises CUDA
    target = write_qwen3_target(tmp_path / "t", seed=0, scale=1.0)
    draft = write_drafter(tmp_path / "d", layers=2, target_layers=6, block=4)
    ours_t, _ = load_model(tmp_path / "t")
    ours_d, _ = load_drafter(tmp_path / "d")
    seen = set()
    for prompt in ([3, 9, 14, 2, 7], [5, 5, 5], [60, 1, 33, 12, 40, 8, 8]):
        ref = reference_dflash.dflash_generate(draft, target, torch.tensor([prompt]), 40, None, 0.0, return_stats=True)
        got = speculate(ours_t, ours_d, prompt, 40)
        assert got.tokens == ref.output_ids[0, len(prompt):].tolist()
        assert got.accepted == ref.acceptance_lengths
        seen.update(got.accepted)
    assert {1, 4} <= seen and len(seen) >= 3  # rejected at once, accepted whole, and cut in between


def _crop_with(real, cache, n):
    extra = cache.get_seq_length() - n
    if extra > 0:
        real(cache, -extra)


@pytest.mark.slow
def test_sampled_speculation_follows_the_targets_distribution(tmp_path):
    """With temperature 1 the tokens are the target's samples given the accepted prefix, so the
    distribution of the first three tokens matches plain sampling from the target (chi-square over
    the 27 outcomes of a head that can only say 0, 7 or 9; 500 draws each, seeded)."""
    from unmask.models.loader import load_model
    from unmask.reference.dflash import speculate

    write_qwen3_target(tmp_path / "t", seed=1, scale=0.5)
    write_drafter(tmp_path / "d", layers=1, target_layers=6, block=4)
    model, _ = load_model(tmp_path / "t")
    drafter, _ = load_drafter(tmp_path / "d")
    prompt = [3, 9, 14]
    g = torch.Generator().manual_seed(0)

    def plain():
        ids = list(prompt)
        with torch.inference_mode():
            for _ in range(3):
                x = torch.tensor([ids])
                logits = model(x, torch.arange(len(ids))[None])[0, -1]
                ids.append(int(torch.multinomial(torch.softmax(logits, -1), 1, generator=g)))
        return tuple(ids[len(prompt):])

    spec = [tuple(speculate(model, drafter, prompt, 3, temperature=1.0, generator=g).tokens[:3]) for _ in range(500)]
    base = [plain() for _ in range(500)]
    outcomes = sorted(set(spec) | set(base))
    table = [[spec.count(o) for o in outcomes], [base.count(o) for o in outcomes]]
    assert len(outcomes) >= 6  # a distribution worth comparing
    assert _chi2_pvalue(table) > 0.001


def _chi2_pvalue(table) -> float:
    """Pearson's chi-square test of independence of a 2 x k table (scipy's chi2_contingency)."""
    t = torch.tensor(table, dtype=torch.float64)
    expected = t.sum(1, keepdim=True) * t.sum(0, keepdim=True) / t.sum()
    stat = ((t - expected) ** 2 / expected).sum()
    df = (t.shape[0] - 1) * (t.shape[1] - 1)
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def test_masked_blocks_in_one_forward_equal_separate_forwards(tmp_path):
    """The training layout: several blocks in one forward, each attending to the context before its
    anchor and to itself only (a block mask), give each block's own decoding-time hidden states."""
    write_drafter(tmp_path / "d")
    d, _ = load_drafter(tmp_path / "d")
    g = torch.Generator().manual_seed(3)
    T, B = 10, 4
    context = torch.randn(1, T, 2 * 32, generator=g)
    anchors = [3, 6, 9]
    noise = torch.randn(1, len(anchors) * B, 32, generator=g)
    q_pos = torch.cat([torch.arange(a, a + B) for a in anchors])
    pos = torch.cat([torch.arange(T), q_pos])[None]
    allowed = torch.zeros(len(anchors) * B, T + len(anchors) * B, dtype=torch.bool)
    for i, a in enumerate(anchors):
        allowed[i * B : (i + 1) * B, :a] = True  # the context strictly before the anchor
        allowed[i * B : (i + 1) * B, T + i * B : T + (i + 1) * B] = True  # its own block
    with torch.inference_mode():
        together = d(noise, context, pos, mask=allowed[None, None])
        for i, a in enumerate(anchors):
            alone = d(noise[:, i * B : (i + 1) * B], context[:, :a], torch.arange(a + B)[None])
            torch.testing.assert_close(together[:, i * B : (i + 1) * B], alone, rtol=1e-5, atol=1e-5)
