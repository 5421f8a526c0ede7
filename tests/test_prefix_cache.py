"""The prefix cache across requests (kv/prefix.py): the pool's hash chain, its leaf-first LRU
eviction under a byte budget, and in the engine: a request that reuses a cached prompt prefix
writes exactly what it writes without the cache, token for token, for the kinds whose prompt K/V
depend on nothing after them (block models' exact cache, the AR twin's causal cache), under
continuous batching and evictions; full-attention rows never reuse."""

import random

import pytest
import torch

from unmask.engine import EngineConfig
from unmask.errors import UnmaskError
from unmask.kv.prefix import PrefixStore

OTHER = "sort : 1 2 3 json : name ann age 9 city oslo pick cat red : sort : 9 8 7 copy : sun"
SHARED = ("copy : red 4 owl json : name bob age 3 4 city rome sort : 7 4 0 9 pick hand red cat sun : "
          "copy : red 4 owl")
TAILS = ["red 4 owl", "blue cat", "sun 3 9", "7 4 0 9", "bob rome", "cat cat", "owl 3", "4 4 red"]


def _fields(n_layers=2, H=2, C=64, D=4, rows=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"k": [torch.randn(rows, H, C, D, generator=g) for _ in range(n_layers)],
            "v": [torch.randn(rows, H, C, D, generator=g) for _ in range(n_layers)]}


def test_store_matches_by_page_and_copies_the_kv():
    store = PrefixStore(1 << 20, 4)
    src = _fields()
    tokens = list(range(10, 30))
    store.insert(tokens, 18, src, 0)  # 4 whole pages within 18 tokens
    assert store.pages == 4
    m, slots = store.match(tokens[:13] + [99] * 7, 20)  # the 4th page differs
    assert m == 12 and len(slots) == 3
    dst = {k: [torch.zeros_like(u) for u in v] for k, v in src.items()}
    store.load(dst, 0, slots)
    for name in src:
        for a, b in zip(src[name], dst[name]):
            assert torch.equal(a[0, :, :12], b[0, :, :12]) and not b[0, :, 12:].any()
    assert store.match([1, 2, 3, 4, 5], 5)[0] == 0  # a prompt nothing shares
    assert store.match(tokens, 3)[0] == 0  # within its limit no whole page


def test_store_evicts_least_recently_used_leaves_first_within_its_budget():
    src = _fields()
    per_page = sum(u[0, :, :4].numel() * 4 for v in src.values() for u in v)
    store = PrefixStore(per_page * 5, 4)  # room for 5 pages
    a, b = list(range(100, 116)), list(range(200, 216))
    store.insert(a, 16, src, 0)  # 4 pages of a
    store.insert(b, 16, src, 0)  # b's 4 pages need room: a's deepest pages go first
    assert store.pages == 5 and store.stats.evicted == 3
    assert store.match(a, 16)[0] == 4  # a's first page, the root of its chain, is what stays
    assert store.match(b, 16)[0] == 16
    assert store.bytes <= per_page * 5


def test_a_hash_collision_is_a_miss_not_a_wrong_reuse():
    store = PrefixStore(1 << 20, 4)
    src = _fields()
    store.insert([1, 2, 3, 4], 4, src, 0)
    key = next(iter(store.table))
    slot, parent, _ = store.table[key]
    store.table[key] = (slot, parent, (9, 9, 9, 9))  # as if other tokens had hashed to this key
    assert store.match([1, 2, 3, 4], 4)[0] == 0


def _computed(engine) -> float:
    """Positions the engine's forwards computed, over every row."""
    return sum(r.rows * r.positions for r in engine.trace)


def _decode(llm, prompts, params, config, stagger=0):
    """Each prompt's canvas and cached tokens, request i added at step i * stagger (all at
    once: 0; one after another, each alone: None)."""
    engine = llm.engine(config)
    reqs, step = [], 0
    if stagger is None:
        for p in prompts:
            reqs.append(engine.add_request(p, params))
            while engine.has_unfinished():
                engine.step()
        return reqs, engine
    while len(reqs) < len(prompts) or engine.has_unfinished():
        while len(reqs) < len(prompts) and len(reqs) * stagger <= step:
            reqs.append(engine.add_request(prompts[len(reqs)], params))
        engine.step()
        step += 1
    return reqs, engine


def _agree_with_uncached(llm, ids, params, page: int) -> list:
    """Decode `ids` without the prefix cache (one at a time), then with it one at a time, joining
    a running batch every other step, and every step under a budget of 2.5 pages of `page` bytes
    (evictions while requests run): every canvas equals the uncached one, the cache's hits are
    the requests' cached tokens, most requests reuse, and each reused token is a position the
    forwards do not compute again. Returns each run's (requests, engine)."""
    plain, uncached = _decode(llm, ids, params, EngineConfig(prefix_cache_mb=0), None)
    want = [q.canvas for q in plain]
    runs = []
    for stagger, mb in [(None, 256), (2, 256), (1, 2.5 * page / 2**20)]:
        reqs, engine = _decode(llm, ids, params, EngineConfig(prefix_cache_mb=mb), stagger)
        assert [q.canvas for q in reqs] == want, (stagger, mb)
        stats = engine.prefix_cache.stats
        assert stats.hits == sum(q.cached_tokens for q in reqs) > 0
        assert sum(q.cached_tokens > 0 for q in reqs) >= len(reqs) // 2
        if stagger is None:
            assert _computed(uncached) - _computed(engine) >= stats.hits
        if mb < 1:
            assert stats.evicted > 0 and engine.prefix_cache.bytes <= mb * 2**20
        runs.append((reqs, engine))
    return runs


@pytest.mark.parametrize("fixture", ["embedded_ar", "embedded_block"])
def test_reused_prefixes_write_what_uncached_requests_write(request, fixture):
    """Sequential, staggered (requests joining a running batch) and under a budget of a few
    pages (evictions): every request's canvas equals its canvas without the prefix cache, and
    the requests after the first reuse the shared prompt's pages (their first step is a window
    from the reused prefix's end, not a full forward)."""
    llm = request.getfixturevalue(fixture)
    rng = random.Random(0)
    prompts = [f"{SHARED if rng.random() < 0.7 else OTHER} copy : {t}" for t in TAILS * 2]
    ids = llm.encode(prompts, chat=False)
    params = llm.default_params(gen_length=16)
    arch = llm.model.config
    page = (arch.block_size or 16) * arch.num_layers * 2 * arch.num_kv_heads * arch.head_dim * 4  # bytes
    reqs, engine = _agree_with_uncached(llm, ids, params, page)[0]
    assert sum(r.kind == "full" for r in engine.trace) == sum(q.cached_tokens == 0 for q in reqs)  # a prefill per miss


def test_full_attention_rows_never_reuse(embedded):
    """A full-attention model's prompt K/V depend on the canvas after the prompt: no reuse."""
    ids = embedded.encode([f"{SHARED} copy : {t}" for t in TAILS[:3]], chat=False)
    reqs, engine = _decode(embedded, ids, embedded.default_params(gen_length=32, cache="prefix"), None, None)
    assert all(q.cached_tokens == 0 for q in reqs)
    assert engine.prefix_cache.pages == 0 and engine.prefix_cache.stats.lookups == 0


def test_the_budget_is_checked():
    for bad in (-1, "8", True, float("nan")):
        with pytest.raises(UnmaskError, match="prefix_cache_mb"):
            EngineConfig(prefix_cache_mb=bad)


def test_speculative_rows_reuse_both_caches(embedded_ar):
    """A DFlash target and its drafter: a reused prefix brings the target's K/V and the drafter's
    context; every request writes what it writes uncached (the target's greedy output), joining
    a running batch and under evictions."""
    from unmask import LLM

    llm = LLM("default-ar", draft="default-dflash")
    rng = random.Random(1)
    prompts = [f"{SHARED if rng.random() < 0.7 else OTHER} copy : {t}" for t in TAILS * 2]
    ids = llm.encode(prompts, chat=False)
    params = llm.default_params(gen_length=16)
    arch, d = llm.model.config, llm.drafter.config
    page = 16 * 2 * 4 * (arch.num_layers * arch.num_kv_heads * arch.head_dim + d.num_layers * d.num_kv_heads * d.head_dim)
    _agree_with_uncached(llm, ids, params, page)


def test_renoising_rows_reuse_the_encoders_prompt(tmp_path):
    """A renoising model's encoder is causal: a reused prefix brings its slots (every full layer's,
    a sliding layer's last window - 1: window 8 here, prompts of 20-50 tokens), and the row
    encodes the rest of its prompt. Seeded requests of two canvases write what they write
    uncached, one after another, joining a running batch and under evictions."""
    from checkpoints import write_diffusion_gemma

    from unmask import LLM

    llm = LLM(write_diffusion_gemma(tmp_path / "dg", window=8))
    rng = random.Random(2)
    shared = [rng.randrange(3, 120) for _ in range(40)]
    other = [rng.randrange(3, 120) for _ in range(20)]
    ids = [(shared if rng.random() < 0.7 else other) + [rng.randrange(3, 120) for _ in range(rng.randrange(1, 8))]
           for _ in range(10)]
    params = [llm.default_params(seed=i, gen_length=32, max_denoising_steps=16) for i in range(len(ids))]

    def run(config, stagger):
        engine = llm.engine(config)
        reqs, step = [], 0
        while len(reqs) < len(ids) or engine.has_unfinished():
            while len(reqs) < len(ids) and (stagger is None and not engine.has_unfinished()
                                            or stagger is not None and len(reqs) * stagger <= step):
                reqs.append(engine.add_request(ids[len(reqs)], params[len(reqs)]))
            engine.step()
            step += 1
        return reqs, engine

    plain, uncached = run(EngineConfig(prefix_cache_mb=0), None)
    want = [q.canvas for q in plain]
    assert len({tuple(c) for c in want}) > 1 and all(c.count(1) < 32 for c in want)  # not a trivial answer
    arch = llm.model.config
    lay = arch.layout
    page = 16 * 4 * 2 * sum(arch.head_dim * arch.num_kv_heads if s else lay.full_head_dim * lay.full_kv_heads
                            for s in lay.sliding)
    for stagger, mb in [(None, 256), (3, 256), (1, 2.5 * page / 2**20)]:
        reqs, engine = run(EngineConfig(prefix_cache_mb=mb), stagger)
        assert [q.canvas for q in reqs] == want, (stagger, mb)
        stats = engine.prefix_cache.stats
        assert stats.hits == sum(q.cached_tokens for q in reqs) > 0
        if stagger is None:
            assert _computed(uncached) - _computed(engine) >= stats.hits
        if mb < 1:
            assert stats.evicted > 0 and engine.prefix_cache.bytes <= mb * 2**20


@pytest.mark.parametrize("fixture", ["embedded_ar", "embedded_block"])
def test_the_server_reuses_prefixes_under_concurrency(request, fixture):
    """24 concurrent requests through `unmask serve`'s app (the openai client, half streamed, a
    budget of a few pages so pages are evicted while requests run): each answer is what the
    model writes for it alone without the cache, usage reports its cached tokens as OpenAI does
    (prompt_tokens_details.cached_tokens), and /metrics the hits and evictions."""
    import asyncio

    openai = pytest.importorskip("openai")
    httpx = pytest.importorskip("httpx")
    from test_server import Server

    llm = request.getfixturevalue(fixture)
    arch = llm.model.config
    page = (arch.block_size or 16) * arch.num_layers * 2 * arch.num_kv_heads * arch.head_dim * 4
    rng = random.Random(3)
    prompts = [f"{SHARED if rng.random() < 0.7 else OTHER} copy : {rng.choice(TAILS)}" for _ in range(24)]
    want = [llm.generate([p], llm.default_params(gen_length=16)).results[0].text for p in prompts]
    server = Server(llm, served_model_name="m", engine_config=EngineConfig(prefix_cache_mb=2.5 * page / 2**20))
    try:
        async def one(client, i):
            await asyncio.sleep(0.01 * i)  # arrivals spread over a running batch
            if i % 2:
                chunks = [c async for c in await client.completions.create(
                    model="m", prompt=prompts[i], max_tokens=16, stream=True, stream_options={"include_usage": True})]
                return "".join(c.choices[0].text for c in chunks if c.choices), chunks[-1].usage
            out = await client.completions.create(model="m", prompt=prompts[i], max_tokens=16)
            return out.choices[0].text, out.usage

        async def main():
            client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
            return await asyncio.gather(*(one(client, i) for i in range(len(prompts))))

        got = asyncio.run(main())
        metrics = httpx.get(server.url + "/metrics").text
    finally:
        server.stop()
    assert [text for text, _ in got] == want
    cached = [use.prompt_tokens_details.cached_tokens for _, use in got]
    assert sum(c > 0 for c in cached) >= 6 and all(c % (arch.block_size or 16) == 0 for c in cached)
    values = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines() if line and line[0] != "#"}
    assert values["unmask_prefix_cache_hits_total"] == sum(cached)
    assert values["unmask_prefix_cache_evictions_total"] > 0
    assert values["unmask_prefix_cache_bytes"] <= values["unmask_prefix_cache_budget_bytes"]
    assert 0 < values["unmask_prefix_cache_hit_rate"] <= 1
