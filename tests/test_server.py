"""`unmask serve` through real clients on loopback: the official openai client, raw HTTP for
errors, concurrent and cancelled streams, and fuzzed bodies. Every server binds 127.0.0.1 on a
free port and stops with its test module."""

import asyncio
import itertools
import json
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
import uvicorn  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from unmask import LLM, GenerationParams  # noqa: E402
from unmask.engine.engine import Engine, EngineConfig  # noqa: E402
from unmask.server.app import build_app  # noqa: E402

PROMPTS = ["copy : red 4 owl", "sort : 7 4 0", "json : name bob age 3 4 city rome", "reverse : sun 3 cat tree"]


class Server:
    def __init__(self, llm, **kw) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.app = build_app(llm, **kw)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def llm(embedded):
    return embedded


@pytest.fixture(scope="module")
def server(llm):
    s = Server(llm, served_model_name="default")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


def _offline(llm, prompt, **kw):
    return llm.generate([prompt], llm.default_params(**kw)).results[0].text


@pytest.mark.parametrize("prompt", PROMPTS)
def test_completion_stream_equals_non_stream_equals_llm_generate(llm, client, prompt):
    plain = client.completions.create(model="default", prompt=prompt)
    chunks = list(client.completions.create(model="default", prompt=prompt, stream=True))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert plain.choices[0].text == streamed == _offline(llm, prompt)
    assert plain.choices[0].finish_reason == "stop" and chunks[-1].choices[0].finish_reason == "stop"
    assert plain.usage.completion_tokens == len(llm.encode(plain.choices[0].text, chat=False)[0]) - 1  # minus BOS


def test_chat_stream_and_usage(llm, client):
    messages = [{"role": "user", "content": "copy : red 4 owl"}]
    plain = client.chat.completions.create(model="default", messages=messages)
    chunks = list(client.chat.completions.create(model="default", messages=messages, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert plain.choices[0].message.content == text == "red 4 owl"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    extra = plain.usage.model_extra
    assert extra["nfe"] >= 1 and extra["tokens_per_forward"] > 0


def test_diffusion_knobs_as_extra_body_fields(llm, client):
    kw = dict(policy="fixed", steps=24, cache="none", block_length=8)
    out = client.completions.create(model="default", prompt=PROMPTS[2], extra_body=kw)
    assert out.choices[0].text == _offline(llm, PROMPTS[2], **kw)
    assert out.usage.model_extra["nfe"] > 3  # one token per step


def test_stop_strings_across_chunks(client):
    chunks = list(client.completions.create(model="default", prompt=PROMPTS[2], stream=True, stop=["\" , \"age"],
                                            extra_body=dict(policy="fixed", steps=24, cache="none")))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == '{ "name" : "bob'
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_max_tokens_is_the_canvas_and_length_is_reported(client):
    out = client.completions.create(model="default", prompt="json : name bob age 3 4 city rome", max_tokens=4)
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens <= 4


@pytest.mark.parametrize("body,status,needle", [
    ({"prompt": "copy : red 4 owl", "threshold": 2}, 400, "threshold 2.0 is outside (0, 1]"),
    ({"prompt": "copy : red 4 owl", "colour": 1}, 400, "colour"),
    ({"prompt": "copy : red 4 owl", "model": "gpt-9"}, 404, "model 'gpt-9' does not exist"),
    ({"prompt": "copy : <|mdm_mask|> owl"}, 400, "special token text '<|mdm_mask|>'"),
    ({"prompt": "copy : red banana owl"}, 400, "not in the vocabulary: 'banana'"),
    ({"prompt": [1, 2, 999]}, 400, "outside the vocabulary"),
    ({"prompt": "copy : red 4 owl", "max_tokens": 5, "block_length": 4}, 400, "not a multiple of block_length"),
    ({"prompt": "copy : red 4 owl", "n": 17}, 400, "n"),
    ({}, 400, "prompt"),
])
def test_errors_in_openai_shape(server, body, status, needle):
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["type"]


def test_malformed_json_is_400(server):
    r = httpx.post(server.url + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "error" in r.json()
    assert r.json()["error"]["param"] == "body" and r.json()["error"]["message"].startswith("body: not valid JSON")


@pytest.mark.parametrize("field,value", [("stream", "yes"), ("stream", 1), ("max_tokens", True), ("max_tokens", "8"),
                                         ("temperature", "0"), ("n", 1.5), ("seed", False), ("ignore_eos", "true"),
                                         ("gen_length", 24.0), ("threshold", True), ("policy", 3)])
def test_wire_types_are_strict(server, field, value):
    """OpenAI refuses these as type errors; so does unmask (pydantic's strict mode)."""
    r = httpx.post(server.url + "/v1/completions", json={"prompt": PROMPTS[0], field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].split(".")[0] == field, r.text
    r = httpx.post(server.url + "/v1/chat/completions",
                   json={"messages": [{"role": "user", "content": PROMPTS[0]}], field: value})
    assert r.status_code == 400, r.text


def test_huge_prompt_is_refused_before_tokenising(server):
    t0 = time.monotonic()
    big = "copy : red 4 owl " * 600_000  # ~10 MB
    r = httpx.post(server.url + "/v1/completions", json={"prompt": big}, timeout=60)
    assert r.status_code == 400 and "characters" in r.json()["error"]["message"], r.text
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": big}]},
                   timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    assert time.monotonic() - t0 < 10


def test_api_key(llm):
    s = Server(llm, api_key="sekret")
    try:
        assert httpx.get(s.url + "/v1/models").status_code == 401
        ok = openai.OpenAI(base_url=s.url + "/v1", api_key="sekret", max_retries=0)
        assert ok.models.list().data[0].id == "unmask"
        assert httpx.get(s.url + "/health").status_code == 200  # health needs no key
        assert httpx.post(s.url + "/playground/stream", json={"prompt": PROMPTS[0]}).status_code == 401
    finally:
        s.stop()


def test_health_models_metrics(server, client):
    client.completions.create(model="default", prompt=PROMPTS[0])
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    assert client.models.list().data[0].id == "default"
    text = httpx.get(server.url + "/metrics").text
    for name in ("unmask_requests_running", "unmask_requests_waiting", "unmask_request_forwards_total",
                 "unmask_tokens_per_forward", "unmask_step_seconds_bucket", "unmask_time_to_first_token_seconds_count"):
        assert name in text


@pytest.fixture()
def slow_steps(monkeypatch):
    """Make each engine step take at least `delay` seconds, so that requests are still running
    when a test cancels them or fills the queue."""
    real = Engine.step

    def slow(self):
        time.sleep(slow.delay)
        return real(self)

    slow.delay = 0.02
    monkeypatch.setattr(Engine, "step", slow)
    return slow


@pytest.mark.slow
def test_64_concurrent_streams_16_cancelled(llm, slow_steps):
    s = Server(llm, engine_config=EngineConfig(max_num_seqs=16))
    try:
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(64)]
        body = lambda p: {"prompt": p, "stream": True, "policy": "fixed", "steps": 24, "cache": "dual"}  # noqa: E731

        async def one(client, i):
            text = ""
            async with client.stream("POST", s.url + "/v1/completions", json=body(prompts[i])) as r:
                if i % 4 == 0:  # 16 clients leave once their stream has started
                    assert r.status_code == 200
                    return None
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        text += json.loads(line[6:])["choices"][0]["text"]
            return text

        async def main():
            async with httpx.AsyncClient(timeout=120) as client:
                return await asyncio.gather(*(one(client, i) for i in range(64)))

        texts = asyncio.run(main())
        alone = {p: _offline(llm, p, policy="fixed", steps=24, cache="dual") for p in PROMPTS}
        for i, t in enumerate(texts):
            if i % 4:
                assert t == alone[prompts[i]], i
        deadline = time.time() + 10
        while time.time() < deadline:
            h = httpx.get(s.url + "/health").json()
            if h["running"] == 0 and h["waiting"] == 0:
                break
            time.sleep(0.05)
        assert h["running"] == 0 and h["waiting"] == 0
        metrics = httpx.get(s.url + "/metrics").text
        aborted = int(next(line.split()[-1] for line in metrics.splitlines()
                           if line.startswith('unmask_requests_total{status="aborted"}')))
        assert aborted == 16
        engine = s.app.state.engine.engine
        assert not engine.requests and engine.rows.k is None and engine.rows.x.shape[0] == 0  # memory freed
    finally:
        s.stop()


def test_queue_full_is_429(llm, slow_steps):
    slow_steps.delay = 0.8  # the first request's first step outlasts the two submissions below
    s = Server(llm, engine_config=EngineConfig(max_num_seqs=1, max_waiting=2))
    try:
        async def main():
            async with httpx.AsyncClient(timeout=60) as client:
                post = lambda: client.post(s.url + "/v1/completions", json={"prompt": PROMPTS[0]})  # noqa: E731
                first = asyncio.create_task(post())
                await asyncio.sleep(0.2)
                second = asyncio.create_task(post())
                await asyncio.sleep(0.2)
                third = await post()
                return [await first, await second, third]

        codes = [r.status_code for r in asyncio.run(main())]
        assert codes[:2] == [200, 200] and codes[2] == 429
    finally:
        s.stop()


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


@pytest.mark.slow
def test_1000_sequential_requests_leave_memory_flat(server):
    with httpx.Client(timeout=60) as c:
        post = lambda i: c.post(server.url + "/v1/completions", json={"prompt": PROMPTS[i % 4]})  # noqa: E731
        for i in range(100):  # warm-up: allocator pools, caches
            assert post(i).status_code == 200
        before = _rss_mib()
        for i in range(1000):
            assert post(i).status_code == 200
        after = _rss_mib()
    engine = server.app.state.engine
    assert engine.num_running == 0 and engine.num_waiting == 0
    assert not engine.engine.requests and engine.engine.rows.k is None
    assert after - before < 25, (before, after)  # MiB


BODIES = st.dictionaries(
    st.sampled_from(["prompt", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "policy", "threshold",
                     "cache", "block_length", "gen_length", "steps", "model", "n", "top_k", "gamma", "logprobs", "x"]),
    st.one_of(st.none(), st.booleans(), st.integers(-5, 600), st.floats(allow_nan=False, allow_infinity=False),
              st.text(max_size=10), st.sampled_from(PROMPTS + ["threshold", "dual", "default", "fixed"]),
              st.lists(st.integers(0, 140), max_size=4), st.lists(st.text(max_size=3), max_size=2)),
    max_size=6)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=BODIES)
def test_fuzzed_bodies_never_500(server, body):
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code < 500, (body, r.text)
    if r.status_code >= 400:
        assert "error" in r.json()
    else:  # accepted: every value had its field's JSON type (no bool as a number, no string as a bool)
        for k, v in body.items():
            if v is None:
                continue
            if k in ("max_tokens", "seed", "n", "top_k", "block_length", "gen_length", "steps"):
                assert isinstance(v, int) and not isinstance(v, bool), (k, v)
            elif k in ("temperature", "top_p", "threshold", "gamma"):
                assert isinstance(v, (int, float)) and not isinstance(v, bool), (k, v)
            elif k == "stream":
                assert isinstance(v, bool), (k, v)
    assert httpx.get(server.url + "/health").status_code == 200


def test_generation_params_of_the_server_match_the_offline_defaults(llm):
    assert llm.default_params() == llm.default_params(**{}) == GenerationParams(**{
        **GenerationParams().__dict__, "gen_length": 24, "block_length": 24, "steps": 24, "policy": "threshold",
        "threshold": 0.9, "cache": "dual"})


@pytest.mark.slow
def test_unmask_serve_command(tmp_path):
    """The CLI entry: `unmask serve` on a free loopback port answers the openai client, then stops."""
    import os
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.Popen([sys.executable, "-m", "unmask", "serve", "--port", str(port), "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.time() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() is not None else ""
            time.sleep(0.2)
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        assert c.completions.create(model="unmask", prompt="copy : red 4 owl").choices[0].text == "red 4 owl"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _chromium() -> str | None:
    import shutil

    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


def test_playground_event_stream(llm, server):
    """Every step: the whole canvas, each position masked, proposed or committed; committed
    positions never change; the last event's text equals the API's answer."""
    body = {"prompt": PROMPTS[2], "policy": "fixed", "steps": 24, "cache": "dual"}
    events = []
    with httpx.stream("POST", server.url + "/playground/stream", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    steps = [e for e in events if e["type"] == "step"]
    assert events[-1]["type"] == "done" and len(steps) > 3
    assert all(len(e["cells"]) == 24 for e in steps)
    assert any(c["state"] == "proposed" for e in steps for c in e["cells"])
    for a, b in zip(steps, steps[1:]):  # committed text is final
        for ca, cb in zip(a["cells"], b["cells"]):
            if ca["state"] == "committed":
                assert cb == ca
    assert [e["nfe"] for e in steps] == list(range(1, len(steps) + 1))
    api = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    assert events[-1]["text"] == api == _offline(llm, PROMPTS[2], policy="fixed", steps=24, cache="dual")
    assert "unmask playground" in httpx.get(server.url + "/").text


def test_playground_takes_a_hole(llm, server):
    """With text after the hole, the canvas is the hole and the final text its middle: the same
    middle as /v1/completions with that suffix."""
    body = {"prompt": "json : color green score 6 5 name liz", "suffix": SUFFIX, "max_tokens": 8}
    with httpx.stream("POST", server.url + "/playground/stream", json=body, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert all(len(e["cells"]) == 8 for e in events if e["type"] == "step")
    api = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    assert events[-1]["type"] == "done" and events[-1]["text"] == api
    assert 'data-hole="1"' in httpx.get(server.url + "/").text  # the page shows the field for it


class Browser:
    """Headless Chromium driven over the DevTools protocol (websocket-client): open a page,
    evaluate JavaScript in it."""

    def __init__(self) -> None:
        import re
        import subprocess
        import tempfile

        import websocket

        self.profile = tempfile.TemporaryDirectory(ignore_cleanup_errors=True)
        self.proc = subprocess.Popen(  # its own process group: close() stops every Chromium process
            [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-quic", "--no-first-run",
             "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
             f"--user-data-dir={self.profile.name}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        deadline = time.time() + 60
        port = None
        while port is None and time.time() < deadline:
            line = self.proc.stderr.readline()
            m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            port = int(m.group(1)) if m else None
        assert port is not None, "Chromium did not start its DevTools endpoint"
        page = next(t for t in httpx.get(f"http://127.0.0.1:{port}/json/list").json() if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60)
        self.ids = itertools.count(1)

    def call(self, method: str, **params):
        i = next(self.ids)
        self.ws.send(json.dumps({"id": i, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == i:
                assert "error" not in msg, msg
                return msg["result"]

    def eval(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def close(self) -> None:
        """Stop Chromium and every process it started (they write into the profile until they end),
        then remove the profile."""
        import os
        import signal
        import subprocess

        self.ws.close()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        self.profile.cleanup()


def _browser_run(url: str, query: dict, *expressions: str) -> list:
    """Load the playground with autorun and wait for it to finish: [its 'done' state, the final
    text, then the value of each JavaScript expression]."""
    import urllib.parse

    browser = Browser()
    try:
        browser.call("Page.navigate", url=f"{url}/?{urllib.parse.urlencode({**query, 'autorun': '1'})}")
        deadline, done = time.time() + 60, None
        while time.time() < deadline:
            done = browser.eval("document.getElementById('final') && document.getElementById('final').dataset.done")
            if done in ("1", "error"):
                break
            time.sleep(0.1)
        return [done, browser.eval("document.getElementById('final').textContent"),
                *(browser.eval(e) for e in expressions)]
    finally:
        browser.close()


@pytest.mark.slow  # a browser
@pytest.mark.skipif(_chromium() is None, reason="no Chromium (.ci/run installs Debian's chromium)")
def test_playground_in_a_headless_browser(server, client):
    """Chromium loads the page, submits a prompt (autorun), waits for the final text; it equals the
    API's answer for the same request, and the canvas shows committed cells."""
    done, final, streamed, cells, stats = _browser_run(
        server.url, {"prompt": PROMPTS[2], "policy": "fixed", "cache": "none"},
        "document.getElementById('streamed').textContent",
        "[...document.querySelectorAll('#canvas .cell')].map(c => c.className)",
        "document.getElementById('stats').textContent")
    assert done == "1", final
    api = client.completions.create(model="default", prompt=PROMPTS[2],
                                    extra_body={"policy": "fixed", "cache": "none"}).choices[0].text
    assert final == streamed == api == '{ "name" : "bob" , "age" : 3 4 , "city" : "rome" }'
    assert len(cells) == 24 and "cell committed" in cells
    assert stats.startswith("step ") and "NFE" in stats


@pytest.mark.slow  # a browser
@pytest.mark.skipif(_chromium() is None, reason="no Chromium (.ci/run installs Debian's chromium)")
@pytest.mark.parametrize("model", ["default-ar", "default-renoise"])
def test_playground_for_a_model_without_policies(model):
    """An AR or renoising model refuses a policy, a cache and blocks: its page hides them and sends
    only the prompt (and a length), and its answer is the API's."""
    m = LLM(model)
    s = Server(m, served_model_name="m")
    try:
        done, final, hidden = _browser_run(
            s.url, {"prompt": PROMPTS[0]},
            "[...document.querySelectorAll('.masked-only')].every(e => e.style.display === 'none')")
        assert done == "1" and hidden and final.strip(), final
        if model == "default-ar":  # greedy: the API's answer (the renoising sampler draws, unseeded here)
            api = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=60).completions.create(
                model="m", prompt=PROMPTS[0]).choices[0].text
            assert final == api
    finally:
        s.stop()


def test_the_ar_twin_is_served_by_the_same_engine(embedded_ar):
    ar = embedded_ar
    s = Server(ar, served_model_name="ar")
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        for p in PROMPTS:
            plain = c.completions.create(model="ar", prompt=p).choices[0].text
            streamed = "".join(ch.choices[0].text for ch in c.completions.create(model="ar", prompt=p, stream=True)
                               if ch.choices)
            assert plain == streamed == ar.generate([p]).results[0].text
        r = httpx.post(s.url + "/v1/completions", json={"prompt": PROMPTS[0], "policy": "threshold"})
        assert r.status_code == 400 and "not used by an autoregressive model" in r.json()["error"]["message"]
        assert '<body data-kind="autoregressive" data-hole="0">' in httpx.get(s.url + "/").text  # no policy
    finally:
        s.stop()


def test_n_choices_stream_and_not(llm, client):
    kw = dict(temperature=1.0, seed=5)
    plain = client.completions.create(model="default", prompt=PROMPTS[2], n=3, **kw)
    assert [c.index for c in plain.choices] == [0, 1, 2]
    for c in plain.choices:  # choice i samples with seed + i
        assert c.text == _offline(llm, PROMPTS[2], temperature=1.0, seed=5 + c.index)
    chunks = list(client.completions.create(model="default", prompt=PROMPTS[2], n=3, stream=True, **kw,
                                            stream_options={"include_usage": True}))
    texts = ["", "", ""]
    for ch in chunks:
        for c in ch.choices:
            texts[c.index] += c.text
    assert texts == [c.text for c in plain.choices]
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert plain.usage.prompt_tokens == len(llm.encode(PROMPTS[2], chat=False)[0])


def test_an_error_after_the_stream_started_is_an_error_event(llm, monkeypatch):
    """A failure inside the engine once a stream is open: the client gets an error event, the
    stream closes, and /health reports the stopped engine (503) instead of hanging."""
    real, calls = Engine.step, []

    def failing(self):
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("simulated engine fault")
        return real(self)

    monkeypatch.setattr(Engine, "step", failing)
    s = Server(llm)
    try:
        body = {"prompt": PROMPTS[2], "stream": True, "policy": "fixed", "steps": 24, "cache": "none"}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=30) as r:
            assert r.status_code == 200
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        assert "simulated engine fault" in events[-1]["error"]["message"]
        assert httpx.get(s.url + "/health").status_code == 503
    finally:
        s.stop()


def test_chat_through_the_checkpoints_template(llada):
    """A checkpoint with a chat template (the tiny LLaDA layout): the server renders the messages
    with it, and the answer equals LLM.generate on the same rendered prompt."""
    s = Server(llada, served_model_name="tiny")
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        messages = [{"role": "user", "content": "w1 w2 w3"}]
        out = c.chat.completions.create(model="tiny", messages=messages, max_tokens=8,
                                        extra_body={"block_length": 8})
        text = llada.tokenizer.apply_chat_template(messages)
        ids = llada.tokenizer.encode(text, add_special_tokens=False)
        ref = llada.generate([ids], llada.default_params(gen_length=8, block_length=8)).results[0].text
        assert out.choices[0].message.content == ref
        bad = httpx.post(s.url + "/v1/chat/completions",
                         json={"messages": [{"role": "user", "content": "w1 <|eot_id|> w2"}]})
        assert bad.status_code == 400 and "<|eot_id|>" in bad.json()["error"]["message"]
    finally:
        s.stop()


def test_a_block_diffusion_model_is_served_with_any_max_tokens(tmp_path):
    from checkpoints import write_sdar

    block_llm = LLM(write_sdar(tmp_path / "sdar"))
    s = Server(block_llm, served_model_name="sdar")
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=60)
        for max_tokens in (7, 12):  # blocks of 4: a partial last block, and whole blocks
            full = c.completions.create(model="sdar", prompt="w1 w2 w3", max_tokens=max_tokens)
            parts = c.completions.create(model="sdar", prompt="w1 w2 w3", max_tokens=max_tokens, stream=True)
            streamed = "".join(ch.choices[0].text for ch in parts)
            want = block_llm.generate(["w1 w2 w3"], block_llm.default_params(gen_length=max_tokens), chat=False)
            assert full.choices[0].text == streamed == want.results[0].text
            assert full.usage.completion_tokens <= max_tokens
    finally:
        s.stop()


def test_adaptive_cache_settings_pass_through(llm, server):
    """The adaptive cache's knobs are request fields like the other decoding knobs; a bad one is a
    400 that names it."""
    body = {"prompt": PROMPTS[2], "policy": "threshold", "threshold": 0.9, "block_length": 8, "cache": "adaptive",
            "refresh_below": 0.8, "refresh_tokens": 5, "refresh_scope": "canvas"}
    text = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    assert text == _offline(llm, PROMPTS[2], policy="threshold", threshold=0.9, block_length=8, cache="adaptive",
                            refresh_below=0.8, refresh_tokens=5, refresh_scope="canvas")
    r = httpx.post(server.url + "/v1/completions", json={**body, "cache": "dual"}, timeout=60)
    assert r.status_code == 400 and "refresh_tokens 5" in r.json()["error"]["message"]


# ---- infilling: OpenAI's suffix and unmask's templates -------------------------------------------

SUFFIX = '"score" : 6 5 , "name" : "liz" }'
TEMPLATE = 'json : color green score 6 5 name liz <|hole:6|> , "score" : 6 5 , <|hole:8|>'


def test_suffix_streamed_equals_whole_equals_llm_generate(llm, client):
    prompt = "json : color green score 6 5 name liz"
    plain = client.completions.create(model="default", prompt=prompt, suffix=SUFFIX, max_tokens=8)
    chunks = list(client.completions.create(model="default", prompt=prompt, suffix=SUFFIX, max_tokens=8, stream=True))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    offline = llm.generate([prompt], llm.default_params(gen_length=8), suffix=SUFFIX).results[0]
    assert plain.choices[0].text == streamed == offline.text
    without = client.completions.create(model="default", prompt=prompt, max_tokens=8).choices[0].text
    assert plain.usage.prompt_tokens == len(llm.encode(prompt, chat=False)[0]) + len(SUFFIX.split())
    assert plain.choices[0].text != without or plain.choices[0].finish_reason == "length"


def test_template_streamed_equals_whole_equals_llm_infill(llm, client):
    body = {"model": "default", "prompt": TEMPLATE, "template": True}
    whole = httpx.post(client.base_url.join("completions").__str__(), json=body, timeout=60).json()
    offline = llm.infill(TEMPLATE, llm.default_params()).results[0]
    choice = whole["choices"][0]
    assert choice["text"] == offline.text and choice["holes"] == offline.holes
    assert ', "score" : 6 5 ,' in choice["text"]  # the fixed text between the holes, in place
    with httpx.stream("POST", client.base_url.join("completions").__str__(), json=dict(body, stream=True),
                      timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == choice["text"]
    assert events[-1]["choices"][0]["holes"] == offline.holes
    assert whole["usage"]["completion_tokens"] == len(offline.token_ids)


@pytest.mark.parametrize("body,needle", [
    ({"prompt": "json : color", "suffix": "<|mdm_mask|>"}, "special token text"),
    ({"prompt": "json : color", "suffix": "banana"}, "not in the vocabulary: 'banana'"),
    ({"prompt": TEMPLATE, "template": True, "suffix": "x"}, "give a suffix or a template, not both"),
    ({"prompt": TEMPLATE, "template": True, "stop": ["x"]}, "stop strings do not apply to a template"),
    ({"prompt": "json : <|hole:0|>", "template": True}, "has no room"),
    ({"prompt": "json : color", "template": True}, "template has no hole"),
    ({"prompt": TEMPLATE, "template": True, "policy": "edit", "hole_length": "exact"}, "could rewrite the fixed text"),
])
def test_infilling_errors(server, body, needle):
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]


def test_a_model_that_cannot_see_a_suffix_refuses_it_by_name(embedded_ar):
    s = Server(embedded_ar, served_model_name="ar")
    try:
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "copy : red", "suffix": "owl"}, timeout=30)
        assert r.status_code == 400 and "autoregressive model attends to earlier tokens only" in r.text
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "copy : red <|hole:4|> owl", "template": True})
        assert r.status_code == 400 and "autoregressive model attends to earlier tokens only" in r.text
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "copy : red 4 owl <|hole:4|>", "template": True})
        assert r.status_code == 200 and r.json()["choices"][0]["holes"]  # a hole at the end: any model
    finally:
        s.stop()


def test_a_template_stream_skips_each_hole_after_its_end_of_text(llm):
    """The region streams as its committed prefix grows: a hole's end of text and its padding
    are skipped, the fixed text after it and the next hole follow; nothing is retracted."""
    from unmask import holes
    from unmask.server.text import TextStream

    t = holes.encode(llm.tokenizer, "copy : red <|hole:4|> owl <|hole:3|>", llm.token_ids.mask, 8)
    red, sun = (llm.tokenizer.encode(w, add_special_tokens=False)[0] for w in ("red", "sun"))
    eos, owl = llm.token_ids.eos, t.region[4]
    st = TextStream(llm, [], t)
    sent = st.add([red, eos]) + st.add([eos, eos, owl]) + st.add([sun, sun]) + st.add([eos])
    assert sent + st.flush() == "red owl sun sun" == st.text
    assert st.hole_texts() == ["red", "sun sun"] and st.ends == 2 and st.ids == [red, sun, sun]


def _joined(chunks, n):
    """Streamed choices joined: each choice's text and its logprob entries."""
    texts, lps = [""] * n, [[] for _ in range(n)]
    for ch in chunks:
        for c in ch.choices:
            piece = c.text if hasattr(c, "text") else (c.delta.content or "")
            texts[c.index] += piece
            if c.logprobs is not None:
                lps[c.index] += c.logprobs.tokens if hasattr(c.logprobs, "tokens") else [e.token for e in c.logprobs.content]
    return texts, lps


def test_every_supported_field_through_the_openai_client(llm, client):
    """The openai client's streamed and whole paths, completions and chat, with every OpenAI
    field unmask serves set at once (sampling with a seed, n, stop, logprobs, the length, the
    accepted no-op fields, stream_options; a suffix on completions, response_format on chat):
    streamed equals whole, each choice equals LLM.generate with seed + its index, and usage
    counts what was sent."""
    common = dict(model="default", temperature=0.8, top_p=0.95, seed=11, n=2, stop=["zzz"], user="u-1",
                  frequency_penalty=0, presence_penalty=0)
    prompt = "copy : red 4 owl"
    comp = dict(common, prompt=prompt, max_tokens=12, logprobs=2, echo=False, suffix=" red")
    whole = client.completions.create(**comp)
    chunks = list(client.completions.create(**comp, stream=True, stream_options={"include_usage": True}))
    texts, lps = _joined(chunks, 2)
    assert texts == [c.text for c in whole.choices]
    assert lps == [c.logprobs.tokens for c in whole.choices]
    for c in whole.choices:
        want = llm.generate([prompt], llm.default_params(temperature=0.8, top_p=0.95, seed=11 + c.index, gen_length=12),
                            chat=False, suffix=" red").results[0].text
        assert c.text == want and "".join(c.logprobs.tokens) == c.text
        assert all(len(top) <= 3 for top in c.logprobs.top_logprobs)  # the chosen token beside the 2 most likely
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert whole.usage.prompt_tokens == len(llm.encode(prompt + " red", chat=False)[0])
    messages = [{"role": "system", "content": "json"}, {"role": "user", "content": "json : name bob age 3 4 city rome"}]
    # (no stop: a stop string is refused with structured output, whose output must stay in its language)
    chat = dict({k: v for k, v in common.items() if k != "stop"}, messages=messages, max_completion_tokens=24,
                logprobs=True, top_logprobs=2, response_format={"type": "json_object"})
    whole = client.chat.completions.create(**chat)
    chunks = list(client.chat.completions.create(**chat, stream=True, stream_options={"include_usage": True}))
    texts, lps = _joined(chunks, 2)
    assert texts == [c.message.content for c in whole.choices]
    assert lps == [[e.token for e in c.logprobs.content] for c in whole.choices]
    from unmask.constrain import Constraint
    for c in whole.choices:
        assert c.message.content.startswith("{") and c.message.content.endswith("}")
        want = llm.generate([messages[-1]["content"]], llm.default_params(temperature=0.8, top_p=0.95,
                            seed=11 + c.index, gen_length=24), chat=False,
                            constraint=Constraint.json_schema({"type": "object"})).results[0].text
        assert c.message.content == want
        assert all(len(e.top_logprobs) == 2 for e in c.logprobs.content)
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
