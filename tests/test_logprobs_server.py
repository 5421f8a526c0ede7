"""logprobs through `unmask serve`: completions' `logprobs` and chat's `logprobs` / `top_logprobs`
from the official openai client, streamed and whole (equal), equal to the engine's, for every
row kind; the refusals are 400s."""

import json
import math

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from test_server import Server, client, llm, server  # noqa: E402,F401  (the embedded model's server and client)
from unmask import LLM  # noqa: E402

PROMPTS = ["copy : red 4 owl", "json : name bob age 3 4 city rome", "sort : 7 4 0 9", "pick hand red cat sun :"]


def _engine_logprobs(llm, prompt, params, k):
    engine = llm.engine()
    req = engine.add_request(llm.encode([prompt], chat=False)[0], params, logprobs=k)
    out = []
    while engine.has_unfinished():
        for o in engine.step():
            out += o.logprobs or []
    return req, out


def _completion(c, prompt, k, **kw):
    whole = c.completions.create(model="default", prompt=prompt, logprobs=k, **kw)
    chunks = [x for x in c.completions.create(model="default", prompt=prompt, logprobs=k, stream=True, **kw)
              if x.choices]
    lp = whole.choices[0].logprobs
    text = whole.choices[0].text
    streamed = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for x in chunks:
        if x.choices[0].logprobs is not None:
            for key in streamed:
                streamed[key] += getattr(x.choices[0].logprobs, key)
    assert "".join(x.choices[0].text for x in chunks) == text
    assert streamed == {key: getattr(lp, key) for key in streamed}  # streamed equals whole
    assert "".join(lp.tokens) == text  # each token's text is its slice of the answer
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    return whole, lp


@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_completion_logprobs_streamed_equal_whole_equal_engine(llm, client, prompt):
    whole, lp = _completion(client, prompt, 3)
    assert whole.usage.completion_tokens == len(lp.tokens)
    _, want = _engine_logprobs(llm, prompt, llm.default_params(), 3)
    assert [round(v, 5) for v in lp.token_logprobs] == [round(v, 5) for v, _ in want[: len(lp.tokens)]]
    for t, chosen, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert top[t] == chosen and 3 <= len(top) <= 4  # the 3 most likely and the chosen one
        assert all(v <= max(top.values()) for v in top.values())


def test_chat_logprobs_and_top_logprobs(client):
    msgs = [{"role": "user", "content": PROMPTS[1]}]
    whole = client.chat.completions.create(model="default", messages=msgs, logprobs=True, top_logprobs=2)
    chunks = [x for x in client.chat.completions.create(model="default", messages=msgs, logprobs=True, top_logprobs=2,
                                                        stream=True) if x.choices]
    content = whole.choices[0].logprobs.content
    streamed = [e for x in chunks if x.choices[0].logprobs is not None for e in x.choices[0].logprobs.content]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]
    assert "".join(e.token for e in content) == whole.choices[0].message.content
    for e in content:
        assert bytes(e.bytes).decode() == e.token and len(e.top_logprobs) == 2 and e.logprob <= 0
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
    plain = client.chat.completions.create(model="default", messages=msgs, logprobs=True)
    assert all(e.top_logprobs == [] for e in plain.choices[0].logprobs.content)
    assert [e.logprob for e in plain.choices[0].logprobs.content] == [e.logprob for e in content]
    none = client.chat.completions.create(model="default", messages=msgs)
    assert none.choices[0].logprobs is None


def test_a_stop_string_cuts_the_logprobs_with_the_text(client):
    whole, lp = _completion(client, PROMPTS[0], 1, stop=[" 4"])
    assert whole.choices[0].text == "red" and lp.tokens == ["red"]


def test_n_choices_each_have_their_logprobs(client):
    whole = client.completions.create(model="default", prompt=PROMPTS[0], logprobs=0, n=2, temperature=1.0, seed=3)
    for ch in whole.choices:
        assert "".join(ch.logprobs.tokens) == ch.text
        assert all(len(top) == 1 for top in ch.logprobs.top_logprobs)  # logprobs 0: the chosen token alone


@pytest.mark.parametrize("body, param", [
    ({"prompt": "a", "logprobs": 21}, "logprobs"),
    ({"prompt": "a", "logprobs": True}, "logprobs"),
    ({"prompt": "a", "logprobs": -1}, "logprobs"),
    ({"prompt": "a", "echo": True}, "echo"),
    ({"prompt": "copy <|hole:4|> ok", "template": True, "logprobs": 1}, "logprobs"),
])
def test_completion_refusals(server, body, param):
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize("body, param", [
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logprobs": 2}, "logprobs"),
])
def test_chat_refusals(server, body, param):
    r = httpx.post(server.url + "/v1/chat/completions",
                   json={"messages": [{"role": "user", "content": "copy : red"}], **body}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def _kind_llm(kind, embedded_ar, embedded_block, tmp_path):
    if kind == "autoregressive":
        return embedded_ar
    if kind == "block":
        return embedded_block
    if kind == "speculative":
        from test_speculative import _random_drafter

        ar = embedded_ar
        return LLM.from_parts(ar.model, ar.tokenizer, ar.token_ids, drafter=_random_drafter(ar.model, block=4))
    pytest.importorskip("transformers", minversion="5.24")
    import warnings

    from checkpoints import write_diffusion_gemma

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LLM(write_diffusion_gemma(tmp_path))


@pytest.mark.parametrize("kind", ["autoregressive", "block", "speculative", "renoising"])
def test_every_row_kind_serves_logprobs(kind, embedded_ar, embedded_block, tmp_path):
    """Each kind through the server: streamed equals whole, equal to its engine's logprobs."""
    llm = _kind_llm(kind, embedded_ar, embedded_block, tmp_path)
    s = Server(llm, served_model_name="default")
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=60)
        prompt = "copy : red 4 owl" if kind != "renoising" else "w1 w2 3"
        kw = {"seed": 1, "max_tokens": 40} if kind == "renoising" else {}
        whole, lp = _completion(c, prompt, 2, **kw)
        assert lp.tokens and all(math.isfinite(v) and v <= 0 for v in lp.token_logprobs)
        given = {"seed": 1, "gen_length": 40} if kind == "renoising" else {}
        _, want = _engine_logprobs(llm, prompt, llm.params_for(given), 2)
        assert [round(v, 5) for v in lp.token_logprobs] == [round(v, 5) for v, _ in want[: len(lp.tokens)]]
    finally:
        s.stop()
