"""Ray: `unmask serve --replicas` (the OpenAI server's own tests run again through Ray Serve: Ray's
HTTP proxy, the OpenAI ingress, two engine replicas; the API key through a second application; a
replica killed in the middle of a bounded load on loopback) and `--data-parallel` on Ray Data (the
same per-example results as one process). One local Ray instance for the module; it stops with
the module."""

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from test_server import (  # noqa: E402  the same tests, through the proxy (their fixtures are this module's)
    PROMPTS,
    _offline,
    test_chat_stream_and_usage,
    test_completion_stream_equals_non_stream_equals_llm_generate,
    test_diffusion_knobs_as_extra_body_fields,
    test_errors_in_openai_shape,
    test_health_models_metrics,
    test_malformed_json_is_400,
    test_max_tokens_is_the_canvas_and_length_is_reported,
    test_n_choices_stream_and_not,
    test_playground_event_stream,
    test_stop_strings_across_chunks,
)

from unmask.server.ray_serve import build  # noqa: E402

pytestmark = pytest.mark.slow

__all__ = ["test_chat_stream_and_usage", "test_completion_stream_equals_non_stream_equals_llm_generate",
           "test_diffusion_knobs_as_extra_body_fields", "test_errors_in_openai_shape", "test_health_models_metrics",
           "test_malformed_json_is_400", "test_max_tokens_is_the_canvas_and_length_is_reported",
           "test_n_choices_stream_and_not", "test_playground_event_stream", "test_stop_strings_across_chunks"]


class RayServer:
    """Ray Serve on loopback: the plain application at /, a keyed one at /keyed."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        serve.start(http_options={"host": "127.0.0.1", "port": self.port})
        serve.run(build("default", replicas=2, served_model_name="default"), name="plain", route_prefix="/")
        serve.run(build("default", replicas=1, served_model_name="default", api_key="sesame"), name="keyed",
                  route_prefix="/keyed")
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        serve.shutdown()


@pytest.fixture(scope="module")
def ray_cluster():
    # logical CPUs: three replicas and two Data actors of one thread each share this machine's two cores
    from unmask.cluster import init_ray

    init_ray(None, num_cpus=5)  # a local instance with unmask's Serve timeouts for busy cores
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def server(ray_cluster):
    s = RayServer()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def llm(embedded):
    return embedded


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


def test_api_key_through_the_proxy(server):
    url = server.url + "/keyed/v1/completions"
    body = {"model": "default", "prompt": PROMPTS[0]}
    r = httpx.post(url, json=body, timeout=60)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.post(url, json=body, headers={"Authorization": "Bearer sesame"}, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "red 4 owl"


def test_requests_spread_over_both_replicas(server):
    """Ray's router sends concurrent requests to both replicas (each /health answer comes from one)."""
    pids = set()
    for _ in range(20):
        h = serve.get_deployment_handle("EngineReplica", app_name="plain")
        pids.add(h.pid_.remote().result())
    assert len(pids) == 2


def test_a_replica_killed_under_load(llm, server, client):
    """24 concurrent requests (half streamed); one replica is killed while they run. Its in-flight
    requests end with OpenAI-shaped errors within the timeout; every other one returns the text it
    gets alone; Ray replaces the replica; afterwards nothing runs or waits."""
    kw = dict(policy="fixed", steps=48, cache="none", block_length=8)  # slow enough to be running at the kill
    want = {p: _offline(llm, p, gen_length=48, **kw) for p in PROMPTS}

    def ask(i):
        p = PROMPTS[i % len(PROMPTS)]
        try:
            if i % 2:
                chunks = client.completions.create(model="default", prompt=p, max_tokens=48, stream=True, extra_body=kw)
                return p, "".join(c.choices[0].text for c in chunks if c.choices)
            return p, client.completions.create(model="default", prompt=p, max_tokens=48, extra_body=kw).choices[0].text
        except openai.APIError as e:  # an OpenAI-shaped error: the openai client parsed it
            return p, e

    names = [a for a in ray.util.list_named_actors(all_namespaces=True)
             if "EngineReplica" in a["name"] and "plain" in a["name"]]
    victim = ray.get_actor(names[0]["name"], namespace=names[0]["namespace"])
    t0 = time.time()
    with ThreadPoolExecutor(24) as pool:
        futures = [pool.submit(ask, i) for i in range(24)]
        time.sleep(1.0)
        ray.kill(victim, no_restart=False)
        results = [f.result(timeout=120) for f in futures]
    assert time.time() - t0 < 120
    lost = [r for _, r in results if isinstance(r, Exception)]
    for p, r in results:
        if not isinstance(r, Exception):
            assert r == want[p], (p, r)
        else:  # the replica's death, as an OpenAI error body or stream event (not a timeout)
            assert "replica" in str(r) or "server_error" in str(r), (type(r).__name__, str(r))
    print(f"replica killed under load: {len(lost)} of {len(results)} requests lost")
    assert len(lost) < len(results)  # the other replica served its share
    deadline = time.time() + 90  # Ray replaces the dead replica (its death noticed first: until then
    while time.time() < deadline:  # the controller may still count it as running)
        st = serve.status().applications["plain"].deployments["EngineReplica"]
        alive = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)}
        if names[0]["name"] not in alive and st.replica_states.get("RUNNING", 0) == 2 and len(st.replica_states) == 1:
            break
        time.sleep(1)
    assert serve.status().applications["plain"].deployments["EngineReplica"].replica_states.get("RUNNING", 0) == 2, \
        serve.status().applications["plain"].deployments["EngineReplica"]
    assert client.completions.create(model="default", prompt=PROMPTS[0]).choices[0].text == "red 4 owl"
    for _ in range(6):  # nothing left running or waiting on any replica
        h = httpx.get(server.url + "/health", timeout=30).json()
        assert h.get("running") == 0 and h.get("waiting") == 0, h


def test_data_parallel_equals_one_process(llm, ray_cluster):
    """eval on two Ray Data actors (the seam gsm8k, humaneval and bench decode through too:
    LLM.generate_batches): the same per-example results and forwards as one process, under seeded
    sampling; the progress callback sees every example."""
    from unmask.bench.data_parallel import DataParallelLLM
    from unmask.evaluate import evaluate

    dp = DataParallelLLM(llm, 2, actor_cpus=1)
    params = llm.default_params(gen_length=16, temperature=0.8, seed=3)  # seeded sampling: batch-invariant too
    seen = []
    one = evaluate(llm, ("sort",), 12, params, batch_size=4, keep_samples=12)
    two = evaluate(dp, ("sort",), 12, params, batch_size=4, keep_samples=12, progress=seen.append)
    assert sum(seen) == 12
    for a, b in zip(one, two):
        assert a.flags == b.flags and a.samples == b.samples and a.nfe == b.nfe


def test_data_parallel_is_refused_by_name(llm, ray_cluster):
    from unmask.bench.data_parallel import DataParallelLLM
    from unmask.errors import UnmaskError

    for bad in (0, -2, "2", True):
        with pytest.raises(UnmaskError, match="data_parallel"):
            DataParallelLLM(llm, bad)


def test_serve_replicas_command(tmp_path):
    """`unmask serve --replicas 1` starts its own local Ray instance (beside this module's), answers
    the openai client through the proxy and stops on Ctrl-C; bad replica settings and a bad model
    are refused by name before Ray starts."""
    import os
    import signal
    import subprocess
    import sys

    from unmask.cli import main

    for argv, needle in ((["--replicas", "0"], "--replicas 0"), (["--min-replicas", "3", "--max-replicas", "1"],
                                                                   "below --min-replicas"),
                         (["--replicas", "1", "--model", str(tmp_path / "nope")], "does not exist")):
        assert main(["serve", *argv]) == 2
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    # Ctrl-C as a terminal sends it, whatever this test was started under (a shell's background job
    # ignores SIGINT, and a child inherits that)
    proc = subprocess.Popen([sys.executable, "-m", "unmask", "serve", "--replicas", "1", "--port", str(port),
                             "--device", "cpu"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # its stderr (Ray forwards the replicas' logs there) is read as it comes: a full pipe would
    # block the server in a write and it could never stop
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    tail = lambda: "".join(err[-30:])  # noqa: E731
    try:
        deadline = time.time() + 300  # Ray, Serve and a replica starting on loaded cores
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.time() < deadline, tail()
            time.sleep(0.5)
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=60)
        r = c.completions.with_raw_response.create(model="unmask", prompt="copy : red 4 owl")
        assert r.parse().choices[0].text == "red 4 owl" and r.headers.get("x-unmask-replica")
        # Ctrl-C while busy: long streams in flight; it stops within 20 s and leaves no process behind
        busy = ThreadPoolExecutor(4)
        for _ in range(8):
            busy.submit(_drain, f"http://127.0.0.1:{port}/v1/completions",
                        {"prompt": "copy : red 4 owl", "max_tokens": 400, "stream": True})
        time.sleep(2)
        tree = _descendants(proc.pid)
        assert len(tree) > 3  # Ray's own processes and workers, started by this command
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)  # graceful for at most 10 s: Serve shuts down, then Ray
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"serve --replicas did not stop within 60 s of Ctrl-C; its stderr ended:\n{tail()}")
        assert code == 0, tail()
        assert time.monotonic() - t0 < 20, time.monotonic() - t0
        time.sleep(1)
        left = [p for p in tree if _alive(p)]
        assert not left, [open(f"/proc/{p}/cmdline").read()[:100] for p in left if _alive(p)]
        busy.shutdown(wait=True, cancel_futures=True)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def _drain(url: str, body: dict) -> None:
    try:
        with httpx.stream("POST", url, json=body, timeout=30) as r:
            for _ in r.iter_bytes():
                pass
    except httpx.HTTPError:  # the server went away mid-stream: expected here
        pass


def _descendants(root: int) -> list[int]:
    """`root` and every process below it (Linux /proc)."""
    import os

    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
