"""DiffusionGemma against its published implementation (transformers' models/diffusion_gemma),
run here on tiny checkpoints that transformers itself writes (save_pretrained: the released
layout, vision tower included): the forward, `generate` token for token and forward for forward
with the same seed, the loader's strictness, and the front ends."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5.24")
from transformers import DiffusionGemmaForBlockDiffusion, DynamicCache  # noqa: E402
from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig  # noqa: E402

from checkpoints import write_diffusion_gemma  # noqa: E402
from unmask import LLM, GenerationParams  # noqa: E402
from unmask.errors import CheckpointError, UnmaskError, UnmaskWarning  # noqa: E402
from unmask.kv.renoise import RenoiseKV  # noqa: E402
from unmask.models.loader import load_model  # noqa: E402


@pytest.fixture(scope="module")
def dg_dir(tmp_path_factory):
    return write_diffusion_gemma(tmp_path_factory.mktemp("dg"))


@pytest.fixture(scope="module")
def ref(dg_dir):
    return DiffusionGemmaForBlockDiffusion.from_pretrained(dg_dir).eval()


@pytest.fixture(scope="module")
def dg(dg_dir):
    with pytest.warns(UnmaskWarning, match="vision-tower tensors skipped"):
        return LLM(dg_dir)


def _padded(prompts):
    B, P = len(prompts), max(map(len, prompts))
    ids = torch.zeros(B, P, dtype=torch.long)
    mask = torch.zeros(B, P, dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, P - len(p):] = torch.tensor(p)
        mask[r, P - len(p):] = 1
    return ids, mask


def _reference(ref, prompts, seed, gen, **settings):
    """transformers' generate right after torch.manual_seed(seed): (generated rows, decoder
    forwards per row, read back from its tokens_per_forward)."""
    ids, mask = _padded(prompts)
    if "gamma" in settings:
        settings["sampler_config"] = EntropyBoundSamplerConfig(entropy_bound=float(settings.pop("gamma")))
    torch.manual_seed(seed)
    out = ref.generate(ids, attention_mask=mask, max_new_tokens=gen, **settings)
    rows = out.sequences[:, ids.shape[1]:]
    kept = (rows != ref.generation_config.pad_token_id).sum(-1)
    return rows.tolist(), (kept / out.tokens_per_forward).round().long().tolist()


def test_forward_matches_transformers(dg, ref):
    """Encoder pass (left padding, a prompt longer than the sliding window) then the denoiser,
    with and without self-conditioning: logits within 1e-5 of their scale of transformers' (float32
    round-off: up to 2e-6 seen, on logits scaled up to tens by the sharpened embedding)."""
    torch.manual_seed(1)
    B, P, L, V = 2, 11, 16, 128
    ids = torch.randint(3, V, (B, P))
    am = torch.ones(B, P, dtype=torch.bool)
    am[1, :4] = False
    canvas, sc = torch.randint(0, V, (B, L)), torch.randn(B, L, V)
    pos, dpos = torch.arange(P)[None], torch.arange(P, P + L)[None]
    with torch.no_grad():
        cache = DynamicCache(config=ref.config.get_text_config(decoder=True))
        masks = ref.model.encoder.create_masks_for_generate(config=ref.config, inputs_embeds=torch.empty(B, P, 0),
                                                            attention_mask=am, cache=cache, position_ids=pos)
        ref.model.encoder(input_ids=ids, attention_mask=masks, cache=cache, position_ids=pos)
        dmask = ref.model.decoder.create_diffusion_decoder_attention_mask(
            config=ref.config, inputs_embeds=canvas[..., None], cache=cache,
            decoder_attention_mask=torch.nn.functional.pad(am, (0, L), value=True))
        lay = dg.arch.layout
        mine = RenoiseKV(lay.sliding, lay.window, B, "cpu")
        with mine.writing(pos.expand(B, -1), torch.ones_like(am), am):
            dg.model.encode(ids, pos.expand(B, -1), mine)
        for signal in (sc, None):
            want = ref(decoder_input_ids=canvas, self_conditioning_logits=signal, decoder_attention_mask=dmask,
                       cache=cache, decoder_position_ids=dpos).logits
            got = dg.model.denoise(canvas, dpos.expand(B, -1), mine, signal)
            assert (want - got).abs().max() <= 1e-5 * want.abs().max().clamp(min=1)


CASES = [  # (seed, prompts, gen_length, settings)
    (0, [[5, 6, 7, 8, 9]], 16, {}),
    (1, [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], [20, 21, 22]], 40, {}),
    (2, [[3] * 12, [4] * 2, [9, 8, 7, 6, 5, 4, 3]], 40, {"gamma": 1.0}),
    (0, [[5, 6, 7], [8, 9, 10, 11]], 40, {"gamma": 0.01, "max_denoising_steps": 6}),
    (2, [[5, 6, 7, 8, 9]], 40, {"t_max": 1.5, "t_min": 0.1, "stability_threshold": 2, "confidence_threshold": 0.5}),
    (0, [[5, 6, 7, 8, 9], [30, 31]], 48, {"stability_threshold": 0, "confidence_threshold": 2.0, "gamma": 3.0}),
    (3, [[11, 12], [13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24]], 40, {"gamma": 0.5, "max_denoising_steps": 10}),
]


@pytest.mark.parametrize("seed,prompts,gen,settings", CASES)
def test_compat_matches_generate(dg, ref, seed, prompts, gen, settings):
    """Token for token and forward for forward, for one row and batches of unequal prompts, one
    and several canvases, early stopping, end of text and its padding."""
    rows, nfe = _reference(ref, prompts, seed, gen, **settings)
    out = dg.generate(prompts, GenerationParams(compat="diffusion-gemma", gen_length=gen, seed=seed, **settings))
    assert [r.raw_ids for r in out.results] == rows
    assert [r.nfe for r in out.results] == nfe


def test_cases_reach_every_path(dg):
    """The cases above are not vacuous: some rows stop denoising early, some end (end of text,
    padding after it), some decode several canvases."""
    early, ended, canvases = set(), set(), set()
    for seed, prompts, gen, settings in CASES:
        p = GenerationParams(compat="diffusion-gemma", gen_length=gen, seed=seed, **settings).check()
        out = dg.generate(prompts, p)
        for r in out.results:
            early.add(r.nfe % p.max_denoising_steps != 0 or r.nfe < p.max_denoising_steps)
            ended.add(r.finish_reason == "stop" and r.raw_ids[-1] == 0)
            canvases.add(len(r.raw_ids) // 16)
    assert early == {True, False} and ended == {True, False} and {1, 3} <= canvases, (early, ended, canvases)


def test_checkpoint_defaults_match_generate(tmp_path):
    """The sampler settings of generation_config.json are the defaults, as the reference reads
    them; the prompt goes through the chat template; the CLI prints the same ids."""
    folder = write_diffusion_gemma(tmp_path / "dg", generation={
        "max_denoising_steps": 7, "t_max": 1.1, "t_min": 0.2, "max_new_tokens": 32,
        "sampler_config": {"entropy_bound": 0.6, "_cls_name": "EntropyBoundSamplerConfig"}})
    ref = DiffusionGemmaForBlockDiffusion.from_pretrained(folder).eval()
    with pytest.warns(UnmaskWarning):
        llm = LLM(folder)
    p = llm.default_params(seed=4)
    assert (p.max_denoising_steps, p.t_max, p.t_min, p.gamma, p.gen_length) == (7, 1.1, 0.2, 0.6, 32)
    ids = llm.encode(["w1 w2 3"])
    torch.manual_seed(4)
    want = ref.generate(torch.tensor(ids)).sequences[:, len(ids[0]):].tolist()
    assert [r.raw_ids for r in llm.generate(["w1 w2 3"], {"seed": 4}).results] == want
    cli = subprocess.run([sys.executable, "-m", "unmask", "generate", "--model", str(folder), "w1 w2 3", "--seed", "4",
                          "--json"], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["generated_ids"] == want
    assert "warning: " in cli.stderr and "vision-tower tensors skipped" in cli.stderr


def test_seed_semantics(dg):
    p = {"seed": 5, "gen_length": 16, "max_denoising_steps": 4}
    a, b = dg.generate([[5, 6, 7]], p), dg.generate([[5, 6, 7]], p)
    c = dg.generate([[5, 6, 7]], {**p, "seed": 6})
    assert a.results[0].raw_ids == b.results[0].raw_ids != c.results[0].raw_ids


@pytest.mark.parametrize("given,match", [
    ({"cache": "dual"}, "cache 'dual': not used by a renoising model"),
    ({"compat": "diffusion-gemma", "cache": "dual"}, "cache 'dual': not used by a renoising model"),
    ({"policy": "fixed"}, "policy 'fixed': not used by a renoising model"),
    ({"block_length": 8}, "block_length 8: not used by a renoising model"),
    ({"temperature": 0.7}, "temperature 0.7"),
    ({"t_max": 0.3}, "t_max 0.3 must be above t_min 0.4"),
    ({"compat": "llada"}, "renoising model"),
    ({"stability_threshold": -1}, "stability_threshold -1"),
    ({"confidence_threshold": 0}, "confidence_threshold 0"),
])
def test_bad_settings_are_named(dg, given, match):
    with pytest.raises(UnmaskError, match=match):
        dg.generate([[5, 6]], given)


def test_renoising_knobs_refused_elsewhere(llada, dg):
    with pytest.raises(UnmaskError, match="t_max 1.0 is a setting of a renoising model's sampler"):
        llada.generate([[5, 6]], {"t_max": 1.0})
    with pytest.raises(UnmaskError, match="reproduces DiffusionGemma's generate"):
        llada.generate([[5, 6]], {"compat": "diffusion-gemma"})
    with pytest.raises(UnmaskError, match="runs as its own batch"):
        dg.engine().add_request([5, 6], GenerationParams(compat="diffusion-gemma"))


ENGINE_REQUESTS = [  # (prompt, settings): each alone is transformers' generate of that prompt
    ([5, 6, 7, 8, 9], {"seed": 0, "gen_length": 32}),
    ([11, 12], {"seed": 3, "gen_length": 48, "gamma": 0.5, "max_denoising_steps": 10}),
    ([13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24], {"seed": 1, "gen_length": 32, "stability_threshold": 2,
                                                        "confidence_threshold": 0.5, "t_max": 1.2, "t_min": 0.3}),
    ([30, 31, 32], {"seed": 4, "gen_length": 16, "stability_threshold": 0, "confidence_threshold": 2.0,
                    "gamma": 3.0}),
]


@pytest.fixture(scope="module")
def alone(ref):
    """Each engine request's output decoded alone by the reference."""
    out = []
    for prompt, kw in ENGINE_REQUESTS:
        settings = {k: v for k, v in kw.items() if k not in ("seed", "gen_length")}
        rows, nfe = _reference(ref, [prompt], kw["seed"], kw["gen_length"], **settings)
        out.append((rows[0][: kw["gen_length"]], nfe[0]))
    return out


@pytest.mark.parametrize("start_at,budget", [((0, 0, 0, 0), 16384), ((0, 3, 5, 9), 16384), ((0, 0, 2, 2), 30)])
def test_engine_requests_equal_the_reference_alone(dg, alone, start_at, budget):
    """Continuous batching (requests joining at different steps, a token budget that runs one
    row per step): each seeded request's answer is the reference's for its prompt alone,
    token for token and forward for forward; the stream is its committed text, canvas by canvas."""
    from unmask.engine import EngineConfig

    engine = dg.engine(EngineConfig(max_num_batched_tokens=budget, trace_limit=None))
    reqs = {}
    step, streamed = 0, {i: [] for i in range(len(ENGINE_REQUESTS))}
    while len(reqs) < len(ENGINE_REQUESTS) or engine.has_unfinished():
        for i, (prompt, kw) in enumerate(ENGINE_REQUESTS):
            if start_at[i] == step:
                reqs[i] = engine.add_request(prompt, dg.default_params(**kw), request_id=f"r{i}")
        for o in engine.step():
            i = int(o.request.id[1:])
            assert o.new_ids == [] or len(streamed[i]) % 16 == 0  # text arrives a whole canvas at a time
            streamed[i] += o.new_ids
        step += 1
        assert step < 2000
    for i, req in reqs.items():
        want, nfe = alone[i]
        assert req.canvas == want and req.nfe == nfe
        assert streamed[i] == dg.result_of(req.canvas, req.nfe, req.commits, 0.0).token_ids
    assert engine.num_running == 0 and engine.kind.kv.batch == 0
    if budget < 32:  # one canvas row per step
        assert max(r.rows for r in engine.trace if r.kind == "full") == 1


def test_engine_abort_frees_the_row(dg, alone):
    engine = dg.engine()
    reqs = [engine.add_request(p, dg.default_params(**kw), request_id=f"r{i}") for i, (p, kw) in
            enumerate(ENGINE_REQUESTS)]
    for _ in range(3):
        engine.step()
    kv = engine.kind.kv
    store = kv._k[0]
    assert engine.abort("r1") and not engine.abort("r1")
    # the encoder's K/V live in row slots: a departure moves the last row into the freed one,
    # a join takes a free row; neither copies the store
    assert kv._k[0] is store and kv.batch == 2
    late = engine.add_request(ENGINE_REQUESTS[1][0], dg.default_params(**ENGINE_REQUESTS[1][1]), request_id="late")
    engine.step()
    assert kv._k[0] is store and kv.batch == 3
    while engine.has_unfinished():
        engine.step()
    assert reqs[1].finish_reason == "abort"
    assert reqs[0].canvas == alone[0][0] and reqs[2].canvas == alone[2][0] and late.canvas == alone[1][0]
    assert engine.num_running == 0 and engine.kind.kv.batch == 0 and engine.rows.sc is None  # nothing held


def test_unseeded_requests_follow_the_global_generator(dg):
    p = dg.default_params(gen_length=16, max_denoising_steps=5)
    torch.manual_seed(7)
    a = dg.generate([[5, 6], [7, 8, 9]], p)
    torch.manual_seed(7)
    b = dg.generate([[5, 6], [7, 8, 9]], p)
    assert [r.raw_ids for r in a.results] == [r.raw_ids for r in b.results]


def test_served_stream_is_committed_canvas_by_canvas(dg):
    openai = pytest.importorskip("openai")
    from test_server import Server

    s = Server(dg, served_model_name="dg")
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=60)
        kw = {"seed": 3, "max_denoising_steps": 8}
        full = c.completions.create(model="dg", prompt="w1 w2 3", max_tokens=40, extra_body=kw)
        chunks = [ch.choices[0].text for ch in c.completions.create(model="dg", prompt="w1 w2 3", max_tokens=40,
                                                                     stream=True, extra_body=kw) if ch.choices]
        want = dg.generate(["w1 w2 3"], dg.default_params(gen_length=40, **kw), chat=False).results[0]
        assert full.choices[0].text == "".join(chunks) == want.text
        # at most one text chunk per finished canvas (a canvas of ids outside the tiny vocabulary decodes to "")
        assert 1 < sum(bool(t) for t in chunks) <= -(-len(want.token_ids) // 16)
        assert full.usage.model_extra["nfe"] == want.nfe
        r = __import__("httpx").post(s.url + "/v1/completions", json={"prompt": "w1", "cache": "dual"})
        assert r.status_code == 400 and "cache 'dual': not used by a renoising model" in r.json()["error"]["message"]
        events = []
        with __import__("httpx").stream("POST", s.url + "/playground/stream", timeout=60,
                                        json={"prompt": "w1 w2", "max_tokens": 32, "seed": 1}) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
        states = {c["state"] for e in events if e["type"] == "step" for c in e["cells"]}
        assert {"stable", "renoised", "committed"} <= states and events[-1]["type"] == "done"
    finally:
        s.stop()


def _copy(dg_dir, tmp_path):
    folder = tmp_path / "c"
    shutil.copytree(dg_dir, folder)
    return folder


def _edit_config(folder, fn):
    cfg = json.loads((folder / "config.json").read_text())
    fn(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("edit,match", [
    (lambda c: c["text_config"].update(use_bidirectional_attention="all"), "use_bidirectional_attention='all'"),
    (lambda c: c["text_config"].update(hidden_activation="silu"), "hidden_activation='silu'"),
    (lambda c: c["text_config"].update(num_experts=None), "lacks num_experts"),
    (lambda c: c["text_config"].update(layer_types=["sliding_attention"]), "one type per layer"),
    (lambda c: c["text_config"]["rope_parameters"]["full_attention"].update(rope_type="yarn"), "rope_type"),
    (lambda c: c.pop("text_config"), "text_config"),
    (lambda c: c.update(tie_word_embeddings=False), "tie_word_embeddings false"),
])
def test_loader_refuses_unsupported_configs(dg_dir, tmp_path, edit, match):
    folder = _copy(dg_dir, tmp_path)
    _edit_config(folder, edit)
    with pytest.raises(CheckpointError, match=match):
        load_model(folder)


def test_loader_is_strict_about_weights(dg_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _copy(dg_dir, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    missing = dict(tensors)
    missing.pop("model.decoder.layers.1.router.per_expert_scale")
    save_file(missing, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match="missing weights model.decoder.layers.1.router.per_expert_scale"):
        load_model(folder)
    save_file({**tensors, "model.decoder.layers.0.extra": torch.zeros(2)}, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match="unexpected weights model.decoder.layers.0.extra"):
        load_model(folder)
    # the tied copies a converted release may also hold are accepted (and not loaded twice)
    dup = {**tensors, "lm_head.weight": tensors["model.decoder.embed_tokens.weight"].clone(),
           "model.encoder.language_model.norm.weight": tensors["model.decoder.norm.weight"].clone()}
    save_file(dup, folder / "model.safetensors")
    with pytest.warns(UnmaskWarning):
        model, _ = load_model(folder)
    assert model.model.decoder.norm.weight.shape == (64,)


def test_packed_experts_equal_a_per_token_loop(dg):
    """The batched grouped multiply over packed (E, 2F, H) experts equals a loop over tokens and
    their chosen experts."""
    layer = dg.model.model.decoder.layers[0]
    torch.manual_seed(0)
    x = torch.randn(13, 64)
    idx, w = layer.router(x)
    got = layer.experts(x, idx, w)
    want = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(idx.shape[1]):
            e = int(idx[t, j])
            gate, up = (layer.experts.gate_up_proj[e] @ x[t]).chunk(2)
            h = torch.nn.functional.gelu(gate, approximate="tanh") * up
            want[t] += w[t, j] * (layer.experts.down_proj[e] @ h)
    assert torch.allclose(got, want, atol=1e-5)


def test_release_style_full_layer_fields(dg_dir, dg, tmp_path):
    """A config that names the full layers' shape by global_head_dim / num_global_key_value_heads
    (as Gemma 4's release does) instead of per_layer_config loads to the same model."""
    folder = _copy(dg_dir, tmp_path)

    def edit(c):
        c["text_config"].pop("per_layer_config")
        c["text_config"].update(global_head_dim=32, num_global_key_value_heads=1)

    _edit_config(folder, edit)
    with pytest.warns(UnmaskWarning):
        model, _ = load_model(folder)
    assert model.config.layout == dg.arch.layout


def test_loglikelihood_is_refused_by_name(dg):
    from unmask.bench.harness import likelihood

    with pytest.raises(UnmaskError, match="loglikelihood of a renoising model"):
        likelihood(dg, [5, 6], [7])
