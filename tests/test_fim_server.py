"""The infill endpoints editors and gateways call, through their real clients on loopback:
Mistral's own SDK (`mistralai`: fim.complete and fim.stream) against /v1/fim/completions, and
llama.cpp's /infill with the request llama.vim sends (autoload/llama.vim: its fields and its
`response_fields`) — the same middle as /v1/completions with `suffix`, streamed and whole; bad
bodies are 400s naming the field."""

import json

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
mistralai = pytest.importorskip("mistralai.client")

from test_server import Server  # noqa: E402

from unmask.server.fim import cut_at_indent, project  # noqa: E402

PREFIX = "json : color green score 6 5 name liz"
SUFFIX = '"score" : 6 5 , "name" : "liz" }'


@pytest.fixture(scope="module")
def server(embedded):
    s = Server(embedded, served_model_name="default")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def mistral(server):
    return mistralai.Mistral(api_key="none", server_url=server.url)


def _completion(server, **body) -> dict:
    r = httpx.post(server.url + "/v1/completions", json={"model": "default", **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_mistral_sdk_fim_equals_completions_with_suffix(server, mistral, embedded):
    want = _completion(server, prompt=PREFIX, suffix=SUFFIX, max_tokens=8)["text"]
    assert want == embedded.generate([PREFIX], embedded.default_params(gen_length=8), suffix=SUFFIX).results[0].text
    got = mistral.fim.complete(model="default", prompt=PREFIX, suffix=SUFFIX, max_tokens=8)
    assert got.choices[0].message.content == want
    assert got.choices[0].finish_reason in ("stop", "length") and got.usage.completion_tokens >= 1
    streamed = "".join(e.data.choices[0].delta.content or "" for e in mistral.fim.stream(
        model="default", prompt=PREFIX, suffix=SUFFIX, max_tokens=8) if e.data.choices)
    assert streamed == want


def test_mistral_sdk_sampling_fields_are_the_completions(server, mistral):
    want = _completion(server, prompt=PREFIX, suffix=SUFFIX, max_tokens=8, temperature=0.8, top_p=0.9, seed=7)
    got = mistral.fim.complete(model="default", prompt=PREFIX, suffix=SUFFIX, max_tokens=8, temperature=0.8,
                               top_p=0.9, random_seed=7)
    assert got.choices[0].message.content == want["text"]
    stopped = mistral.fim.complete(model="default", prompt=PREFIX, suffix=SUFFIX, max_tokens=8, stop=["6"])
    assert "6" not in stopped.choices[0].message.content


def test_min_tokens_through_the_sdk(server, mistral, embedded):
    got = mistral.fim.complete(model="default", prompt="copy : red sun", max_tokens=12, min_tokens=9)
    ids = embedded.tokenizer.encode(got.choices[0].message.content, add_special_tokens=False)
    assert len(ids) >= 9 and got.usage.completion_tokens >= 9


@pytest.mark.parametrize("body,field", [
    ({"suffix": SUFFIX}, "prompt"),
    ({"prompt": PREFIX, "max_tokens": 0}, "max_tokens"),
    ({"prompt": PREFIX, "random_seed": "7"}, "random_seed"),
    ({"prompt": PREFIX, "suffix": "<|mdm_mask|>"}, "suffix"),
    ({"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 4, "min_tokens": 5}, "min_tokens"),
    ({"prompt": PREFIX, "random_seed": 1, "seed": 2}, "random_seed"),
    ({"prompt": PREFIX, "frobnicate": 1}, "frobnicate"),
])
def test_bad_fim_bodies_are_400s_naming_the_field(server, body, field):
    r = httpx.post(server.url + "/v1/fim/completions", json={"model": "default", **body}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field or field in err["message"], err


def _llama_vim_body(**over) -> dict:
    """The request llama.vim's llama#fim sends (ggml-org/llama.vim autoload/llama.vim)."""
    body = {"id_slot": 0, "input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": [], "prompt": "",
            "n_predict": 8, "stop": [], "n_indent": 0, "top_k": 40, "top_p": 0.90,
            "samplers": ["top_k", "top_p", "infill"], "stream": False, "cache_prompt": True,
            "t_max_prompt_ms": 500, "t_max_predict_ms": 1000,
            "response_fields": ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
                                "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
                                "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated",
                                "tokens_cached"]}
    return {**body, **over}


def test_llama_vim_request_gets_the_same_middle(server):
    want = _completion(server, prompt=PREFIX, suffix=SUFFIX, max_tokens=8)["text"]
    r = httpx.post(server.url + "/infill", json=_llama_vim_body(), timeout=60)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["content"] == want
    assert set(got) == set(_llama_vim_body()["response_fields"])  # only what it asked for, paths flattened
    assert got["timings/predicted_n"] >= 1 and got["truncated"] is False
    # streamed: content pieces, then the last event with stop true
    with httpx.stream("POST", server.url + "/infill", json=_llama_vim_body(stream=True, response_fields=None),
                      timeout=60) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    assert "".join(e["content"] for e in events) == want
    assert events[-1]["stop"] is True and all(e["stop"] is False for e in events[:-1])
    assert events[-1]["stop_type"] in ("eos", "limit", "word")


def test_llama_infill_prompt_and_extra_context_come_before_the_hole(server):
    # llama.cpp: input_extra, then the prefix, then `prompt` (what was typed after it), then the hole
    want = _completion(server, prompt="json : color green\nscore 6 5 name liz", suffix=SUFFIX, max_tokens=8)["text"]
    body = _llama_vim_body(input_prefix="score 6 5 name", prompt=" liz", response_fields=["content"],
                           input_extra=[{"filename": "", "text": "json : color green", "time": 3}])
    assert httpx.post(server.url + "/infill", json=body, timeout=60).json()["content"] == want


def test_llama_infill_warm_up_and_several_completions(server):
    # llama.vim's ring-buffer update: n_predict 0, nothing generated
    r = httpx.post(server.url + "/infill", json=_llama_vim_body(n_predict=0, response_fields=[""]), timeout=30)
    assert r.status_code == 200 and r.json() == {}
    # llama.vscode's n_cmpl: a list of completions
    got = httpx.post(server.url + "/infill", json=_llama_vim_body(n_cmpl=2, response_fields=None), timeout=60).json()
    assert isinstance(got, list) and len(got) == 2 and all("content" in g for g in got)


@pytest.mark.parametrize("over,field", [
    ({"n_predict": -2}, "n_predict"),
    ({"input_extra": "main.py"}, "input_extra"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"input_prefix": "", "prompt": ""}, "input_prefix"),
    ({"input_suffix": "banana"}, "input_suffix"),
    ({"top_p": 2}, "top_p"),
])
def test_bad_infill_bodies_are_400s_naming_the_field(server, over, field):
    r = httpx.post(server.url + "/infill", json=_llama_vim_body(**over), timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field or field in err["message"], err


def test_infill_needs_the_api_key(embedded):
    s = Server(embedded, served_model_name="default", api_key="k")
    try:
        assert httpx.post(s.url + "/infill", json=_llama_vim_body(), timeout=30).status_code == 401
        ok = httpx.post(s.url + "/infill", json=_llama_vim_body(), headers={"Authorization": "Bearer k"}, timeout=60)
        assert ok.status_code == 200
    finally:
        s.stop()


def test_n_indent_and_response_fields():
    code = "    a = 1\n    b = 2\n  c = 3\nd = 4\n"
    assert cut_at_indent(code, 4) == ("    a = 1\n    b = 2\n", True)
    assert cut_at_indent(code, 2) == ("    a = 1\n    b = 2\n  c = 3\n", True)
    assert cut_at_indent(code, 0) == (code, False)
    assert cut_at_indent("x\n\n    y", 4) == ("x\n\n    y", False)  # a blank line does not end it
    obj = {"content": "x", "timings": {"prompt_n": 3}, "stop": True}
    assert project(obj, ["content", "timings/prompt_n", "timings/none", ""]) == {"content": "x", "timings/prompt_n": 3}
    assert project(obj, None) == obj


def test_diffusing_streams_the_canvas_as_it_fills(server, embedded):
    """Inception's diffusing mode: each chunk the whole canvas (open positions as ░), the last the
    answer itself — the same as the committed-prefix stream's whole text."""
    body = {"model": "default", "prompt": "copy : red sun 5 owl", "max_tokens": 16, "stream": True}
    want = _completion(server, prompt=body["prompt"], max_tokens=16)["text"]
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "diffusing": True}, timeout=60) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    texts = [e["choices"][0]["text"] for e in events if e["choices"]]
    assert texts[-1] == want and events[-1]["choices"][0]["finish_reason"] is not None
    assert len(texts) >= 2 and "\u2591" in texts[0]  # the first canvas still has open positions
    # through the FIM endpoint too (chat chunks), and refused where it cannot apply
    with httpx.stream("POST", server.url + "/v1/fim/completions", json={
            "model": "default", "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 8, "stream": True,
            "diffusing": True}, timeout=60) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    assert chunks[-1]["choices"][0]["delta"]["content"] == _completion(
        server, prompt=PREFIX, suffix=SUFFIX, max_tokens=8)["text"]
    r = httpx.post(server.url + "/v1/completions", json={**body, "stream": False, "diffusing": True}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "diffusing"


def test_an_ar_twins_prefix_suffix_middle_counts_its_markers(embedded_ar_code):
    """The prompt tokens of a hole on a prefix-suffix-middle AR model are what it reads (its three
    markers included): a repeated request's cached tokens never exceed them."""
    s = Server(embedded_ar_code, served_model_name="m")
    try:
        prompt = "def add(a, b):\n    total = a + b\n    for i in range(10):\n        total += i * 2\n"
        body = {"prompt": prompt, "suffix": "    return c\n", "max_tokens": 8}
        uses = [httpx.post(s.url + "/v1/completions", json=body, timeout=60).json()["usage"] for _ in range(2)]
        ids = embedded_ar_code.encode([prompt], chat=False)[0]
        tail = embedded_ar_code.tokenizer.encode("    return c\n", add_special_tokens=False)
        assert uses[0]["prompt_tokens"] == len(ids) + len(tail) + 3
        assert 0 < uses[1]["prompt_tokens_details"]["cached_tokens"] <= uses[1]["prompt_tokens"]
    finally:
        s.stop()
