"""Replicas behind one OpenAI endpoint, on Ray Serve.

Two deployments, as Ray's own LLM serving (ray.serve.llm) arranges them:
- `EngineReplica` (N replicas, or autoscaled between a minimum and a maximum): one unmask server
  app (server/app.py: the same routes, checks, errors, streaming and playground) with its own
  engine and model, each replica with its CPUs / GPUs declared to Ray; `check_health` reports an
  engine that stopped, so Ray replaces the replica.
  Each response names its replica in the `x-unmask-replica` header.
- `OpenAIIngress` (behind Ray's HTTP proxy): hands each HTTP request, whole, to a replica through
  a Ray deployment handle (Ray's request router picks the replica: power of two choices over
  ongoing requests) and streams the replica's response back as it comes. When the replica dies
  mid-request, the client gets an OpenAI-shaped error (a 503 body, or an `error` event in a
  stream that already started) instead of a hang; other requests are untouched.

ray.serve.llm itself is not used as the front: its LLMConfig accepts only `llm_engine="vLLM"` and
the engine class it builds is injected only through ray.llm's internal modules, so an unmask
engine cannot be plugged in through a public interface (Ray 2.60). Routing, autoscaling, health
checks, replacement and graceful shutdown are Ray Serve's; nothing here routes requests itself.

`unmask serve --replicas N` starts a local Ray instance (or joins one: `--ray-address`), or a
`serve run` config can name `unmask.server.ray_serve:app_builder` (docs/scaling.md).
"""

import asyncio
import json
import os

from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route
from starlette.responses import JSONResponse, Response, StreamingResponse

_HOP = {b"content-length", b"transfer-encoding", b"connection"}


def _error(status: int, message: str) -> dict:
    return {"error": {"message": message, "type": "server_error", "param": None, "code": status}}


# graceful shutdown: a stopping replica finishes its requests for at most 8 s (then they end with
# an error), so `unmask serve --replicas` stops within 20 s of Ctrl-C (cli/serve.py's Shutdown)
@serve.deployment(name="EngineReplica", health_check_period_s=5, health_check_timeout_s=30,
                  graceful_shutdown_wait_loop_s=1, graceful_shutdown_timeout_s=8, max_ongoing_requests=256)
class EngineReplica:
    """One unmask server app and its engine; `handle` runs one HTTP request through the app."""

    def __init__(self, model: str | None, dtype: str | None = None, device: str = "cpu", tensor_parallel: int = 1,
                 served_model_name: str = "unmask", api_key: str | None = None, engine: dict | None = None,
                 threads: int | None = None, draft: str | None = None, quantize: str | None = None,
                 linear_kernel: str | None = None) -> None:
        import torch

        from unmask.engine import EngineConfig
        from unmask.llm import LLM
        from unmask.server.app import build_app

        if threads:
            torch.set_num_threads(threads)
        self.llm = LLM(model, dtype=dtype, device=device, tensor_parallel=tensor_parallel, draft=draft,
                       quantize=quantize, linear_kernel=linear_kernel)
        self.app = build_app(self.llm, served_model_name, api_key, EngineConfig(**(engine or {})))
        self._lifespan = None
        self._start = asyncio.Lock()
        self.pid = os.getpid()
        self.replica = f"{serve.get_replica_context().replica_id.unique_id}"  # named in each response's header

    async def _started(self) -> None:
        async with self._start:
            if self._lifespan is None:
                lifespan = self.app.router.lifespan_context(self.app)
                await lifespan.__aenter__()
                self._lifespan = lifespan

    async def handle(self, req: dict):
        """Run one request (method, path, query, headers, body) through the app; yields
        ("start", status, headers), then ("body", bytes) chunks as the app sends them."""
        await self._started()
        out: asyncio.Queue = asyncio.Queue()
        gone = asyncio.Event()
        sent = False

        async def receive():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": req["body"], "more_body": False}
            await gone.wait()  # the client (or the ingress) went away
            return {"type": "http.disconnect"}

        async def send(message):
            await out.put(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": req["method"],
                 "scheme": "http", "path": req["path"], "raw_path": req["path"].encode(), "root_path": "",
                 "query_string": req["query"].encode(), "headers": [(k.encode(), v.encode()) for k, v in req["headers"]],
                 "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0)}
        task = asyncio.ensure_future(self.app(scope, receive, send))
        try:
            while True:
                get = asyncio.ensure_future(out.get())
                done, _ = await asyncio.wait({get, task}, return_when=asyncio.FIRST_COMPLETED)
                if get not in done:
                    get.cancel()
                    if out.empty():
                        task.result()  # the app ended without a complete response: its error
                        return
                    continue
                msg = get.result()
                if msg["type"] == "http.response.start":
                    headers = [(k.decode(), v.decode()) for k, v in msg.get("headers", []) if k.lower() not in _HOP]
                    yield ("start", msg["status"], headers + [("x-unmask-replica", self.replica)])
                elif msg["type"] == "http.response.body":
                    if msg.get("body"):
                        yield ("body", msg["body"])
                    if not msg.get("more_body"):
                        return
        finally:
            gone.set()
            if not task.done():
                await asyncio.wait({task}, timeout=5)

    def pid_(self) -> int:
        return self.pid

    def check_health(self) -> None:
        """Ray's health check: an engine whose thread stopped makes the replica unhealthy."""
        if self._lifespan is not None:
            engine = self.app.state.engine
            if engine.error is not None:
                raise RuntimeError(f"the engine stopped: {engine.error}")

    def __del__(self) -> None:  # graceful shutdown: the engine's thread and any tensor-parallel ranks
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.close()


@serve.deployment(name="OpenAIIngress", max_ongoing_requests=1024, ray_actor_options={"num_cpus": 0},
                  graceful_shutdown_wait_loop_s=1, graceful_shutdown_timeout_s=8)
@serve.ingress()
class OpenAIIngress:
    """The HTTP front: every request goes whole to a replica; the response streams back."""

    def __init__(self, replicas: DeploymentHandle) -> None:
        self.replicas = replicas.options(stream=True)

    def __serve_build_asgi_app__(self):
        methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
        return Starlette(routes=[Route("/{path:path}", self._request, methods=methods)])

    async def _request(self, request: Request):
        scope = request.scope
        path, root = scope["path"], scope.get("root_path", "")
        if root and path.startswith(root):  # an application under a route prefix: the app's own path
            path = path[len(root):] or "/"
        req = {"method": request.method, "path": path, "query": scope.get("query_string", b"").decode(),
               "headers": [(k.decode(), v.decode()) for k, v in scope["headers"]], "body": await request.body()}
        return await self._forward(req)

    async def _forward(self, req: dict):
        gen = self.replicas.handle.remote(req)
        try:
            first = await gen.__anext__()
        except StopAsyncIteration:
            return JSONResponse(_error(502, "the replica returned no response"), status_code=502)
        except (Exception, asyncio.CancelledError) as e:  # the replica died or could not be reached
            return JSONResponse(_error(503, f"the replica serving this request failed: {_reason(e)}"), status_code=503)
        _, status, headers = first
        streaming = any(k.lower() == "content-type" and "text/event-stream" in v for k, v in headers)
        if not streaming:  # a whole response: gathered here, so a replica dying mid-body is still a 503 body
            try:
                body = b"".join([rest[0] async for kind, *rest in gen])
            except (Exception, asyncio.CancelledError) as e:
                return JSONResponse(_error(503, f"the replica serving this request failed: {_reason(e)}"),
                                    status_code=503)
            return Response(body, status_code=status, headers=dict(headers))

        async def events():
            try:
                async for kind, *rest in gen:
                    yield rest[0]
            except (Exception, asyncio.CancelledError) as e:  # mid-stream: an OpenAI error event ends it
                err = _error(503, f"the replica serving this request failed: {_reason(e)}")
                yield f"data: {json.dumps(err)}\n\n".encode()

        return StreamingResponse(events(), status_code=status, headers=dict(headers))


def _reason(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200]}" if str(e) else type(e).__name__


def build(model: str | None, replicas: int = 1, min_replicas: int | None = None, max_replicas: int | None = None,
          target_ongoing_requests: float = 8.0, replica_cpus: float = 1.0, replica_gpus: float = 0.0,
          dtype: str | None = None, device: str = "cpu", tensor_parallel: int = 1, served_model_name: str = "unmask",
          api_key: str | None = None, engine: dict | None = None, draft: str | None = None,
          quantize: str | None = None, linear_kernel: str | None = None):
    """The Serve application: the ingress over the engine replicas (fixed `replicas`, or autoscaled
    between `min_replicas` and `max_replicas` aiming at `target_ongoing_requests` per replica)."""
    if min_replicas is not None or max_replicas is not None:
        lo = 1 if min_replicas is None else min_replicas
        scaling = {"autoscaling_config": {"min_replicas": lo, "max_replicas": max(lo, max_replicas or lo),
                                          "target_ongoing_requests": target_ongoing_requests,
                                          "upscale_delay_s": 5, "downscale_delay_s": 30}}
    else:
        scaling = {"num_replicas": replicas}
    # a replica with tensor parallelism holds its ranks' CPUs or GPUs
    actor = {"num_cpus": replica_cpus, "num_gpus": replica_gpus * tensor_parallel}
    threads = max(1, int(replica_cpus // max(tensor_parallel, 1))) if device == "cpu" else None
    replica = EngineReplica.options(ray_actor_options=actor, **scaling).bind(
        model, dtype, device, tensor_parallel, served_model_name, api_key, engine, threads, draft, quantize,
        linear_kernel)
    return OpenAIIngress.bind(replica)


def app_builder(args: dict):
    """For `serve run unmask.server.ray_serve:app_builder model=default replicas=2 ...` and Serve
    config files: `build` with the arguments given (numbers as strings are converted)."""
    kw = dict(args)
    for k in ("replicas", "min_replicas", "max_replicas", "tensor_parallel"):
        if k in kw and kw[k] is not None:
            kw[k] = int(kw[k])
    for k in ("target_ongoing_requests", "replica_cpus", "replica_gpus"):
        if k in kw and kw[k] is not None:
            kw[k] = float(kw[k])
    return build(**kw)
