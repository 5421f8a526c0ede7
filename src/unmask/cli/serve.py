"""`unmask serve`."""

import argparse
import math
import os
import signal
import sys
import threading
import time

from unmask.cli.common import MODEL_HELP, add_draft_args, add_parallel_args, load_llm
from unmask.errors import UnmaskError


def cmd_serve(a: argparse.Namespace) -> int:
    try:
        import uvicorn

        from unmask.server.app import build_app
    except ImportError as e:
        raise UnmaskError(f"unmask serve needs fastapi and uvicorn: pip install 'unmask[serve]' ({e})") from None
    from unmask.engine.engine import EngineConfig

    if not 0 <= a.port <= 65535:
        raise UnmaskError(f"--port {a.port} must be in 0..65535")
    config = EngineConfig(max_num_seqs=a.max_num_seqs, max_num_batched_tokens=a.max_num_batched_tokens,
                          max_waiting=a.max_waiting, scheduling=a.scheduling, prefix_cache_mb=a.prefix_cache_mb)
    if a.replicas is not None or a.min_replicas is not None or a.max_replicas is not None:
        return _serve_ray(a, config)
    for flag in RAY_ONLY:  # a Ray Serve setting without replicas would be ignored
        if getattr(a, flag) is not None:
            raise UnmaskError(f"--{flag.replace('_', '-')} is a setting of Ray Serve replicas; give --replicas N "
                              "(or --min-replicas / --max-replicas) with it")
    llm = load_llm(a)
    app = build_app(llm, a.served_model_name, a.api_key, config)
    print(f"unmask: serving {a.served_model_name} ({llm.path}) on http://{a.host}:{a.port} "
          f"(playground at /, OpenAI API under /v1)", file=sys.stderr)
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning")
    return 0


# Ray Serve's own settings (used only with --replicas / --min-replicas / --max-replicas) and their defaults
RAY_DEFAULTS = {"replica_cpus": 1.0, "replica_gpus": 0.0, "target_ongoing_requests": 8.0}
RAY_ONLY = ("ray_address", *RAY_DEFAULTS)


def _serve_ray(a: argparse.Namespace, config) -> int:
    """The same app behind Ray Serve: replicas, Ray's proxy and router (unmask.server.ray_serve)."""
    try:
        import ray
        from ray import serve

        from unmask.server.ray_serve import build
    except ImportError as e:
        raise UnmaskError(f"unmask serve --replicas needs Ray Serve: pip install 'unmask[ray]' ({e})") from None
    for flag in ("replicas", "min_replicas", "max_replicas"):
        v = getattr(a, flag)
        if v is not None and v < 1:
            raise UnmaskError(f"--{flag.replace('_', '-')} {v} must be a positive integer")
    if a.min_replicas and a.max_replicas and a.max_replicas < a.min_replicas:
        raise UnmaskError(f"--max-replicas {a.max_replicas} is below --min-replicas {a.min_replicas}")
    if a.target_ongoing_requests is not None and a.replicas is not None:
        raise UnmaskError(f"--target-ongoing-requests {a.target_ongoing_requests:g} steers autoscaling; with a fixed "
                          f"--replicas {a.replicas} it would be ignored (give --min-replicas / --max-replicas)")
    for flag, default in RAY_DEFAULTS.items():
        value = getattr(a, flag)
        if value is None:
            setattr(a, flag, default)
        elif not (math.isfinite(value) and value >= 0):
            raise UnmaskError(f"--{flag.replace('_', '-')} {value:g} must be a finite number >= 0")
    if a.target_ongoing_requests <= 0:
        raise UnmaskError(f"--target-ongoing-requests {a.target_ongoing_requests:g} must be > 0")
    from unmask.cluster import init_ray, parse_ray_address
    from unmask.llm import LLM, default_device
    from unmask.loading import resolve_model_path

    device = a.device or default_device()
    if device.startswith("cpu") and a.replica_gpus > 0:
        raise UnmaskError(f"--replica-gpus {a.replica_gpus:g} with device {device}: the replicas would hold GPUs they "
                          "do not use (and wait for them on a machine without)")
    if device.startswith("cuda") and a.replica_gpus <= 0:
        raise UnmaskError(f"device {device}: give each replica a GPU with --replica-gpus (e.g. 1), or --device cpu "
                          "(Ray hides GPUs from a replica that reserves none)")
    # every setting a replica uses is checked here, before Ray starts (each replica reads these paths)
    path = LLM.check_args(a.model, a.dtype, device, a.tensor_parallel, a.draft, a.quantize, a.linear_kernel)
    parse_ray_address(a.ray_address)
    model = str(path)
    draft = None if a.draft is None else str(resolve_model_path(a.draft))
    engine = {"max_num_seqs": config.max_num_seqs, "max_num_batched_tokens": config.max_num_batched_tokens,
              "max_waiting": config.max_waiting, "scheduling": config.scheduling,
              "prefix_cache_mb": config.prefix_cache_mb}
    app = build(model, replicas=a.replicas or 1, min_replicas=a.min_replicas, max_replicas=a.max_replicas,
                target_ongoing_requests=a.target_ongoing_requests, replica_cpus=a.replica_cpus,
                replica_gpus=a.replica_gpus, dtype=a.dtype, device=device,
                tensor_parallel=a.tensor_parallel, served_model_name=a.served_model_name, api_key=a.api_key,
                engine=engine, draft=draft, quantize=a.quantize, linear_kernel=a.linear_kernel)
    stop = Shutdown(own_cluster=a.ray_address is None)
    try:
        signal.signal(signal.SIGTERM, _interrupt)  # a service manager's stop is a Ctrl-C
        # without --ray-address a new local instance (never one another program started here)
        init_ray(a.ray_address)
        try:
            serve.start(http_options={"host": a.host, "port": a.port})
            serve.run(app, name="unmask", route_prefix="/", blocking=False)
        except Exception as e:  # Serve or a replica failed to start: its own last words
            lines = [x.strip() for x in str(e).splitlines() if x.strip()]
            raise UnmaskError(f"Ray Serve did not start ({type(e).__name__}): {lines[-1] if lines else e}") from None
        print(f"unmask: serving {a.served_model_name} ({model}) on Ray Serve at http://{a.host}:{a.port} "
              f"({'autoscaled' if a.replicas is None else a.replicas} replicas; Ray at "
              f"{ray.get_runtime_context().gcs_address}); Ctrl-C stops it", file=sys.stderr)
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        stop.run()
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


class Shutdown:
    """Ctrl-C (or SIGTERM) ends `serve --replicas` within STOP_S: Serve's graceful shutdown (replicas
    finish or drop their requests within their own timeout) for at most GRACE_S, then the Ray
    instance this command started, processes and all; another Ctrl-C meanwhile cuts the grace
    short. Joined to another cluster (--ray-address), only this application is deleted and the
    cluster keeps running."""

    GRACE_S = 10.0
    STOP_S = 20.0

    def __init__(self, own_cluster: bool) -> None:
        self.own_cluster = own_cluster
        self.hurry = threading.Event()

    def run(self) -> None:
        import ray
        from ray import serve

        t0 = time.monotonic()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self.hurry.set())
        if not ray.is_initialized():
            return

        def graceful():
            try:
                if self.own_cluster:
                    serve.shutdown()
                else:
                    serve.delete("unmask")
            except Exception:  # the cluster went away first: nothing left to stop gracefully
                pass

        t = threading.Thread(target=graceful, daemon=True, name="unmask-serve-shutdown")
        t.start()
        while t.is_alive() and not self.hurry.is_set() and time.monotonic() - t0 < self.GRACE_S:
            t.join(0.2)
        _shutdown_ray(max(1.0, self.STOP_S - (time.monotonic() - t0) - 1.0))


def _shutdown_ray(timeout: float) -> None:
    """ray.shutdown(), which also ends the local instance this process started; bounded: past
    `timeout` the instance's processes are killed."""
    import ray

    node = getattr(ray._private.worker, "_global_node", None)  # the local instance's processes, if ours
    t = threading.Thread(target=ray.shutdown, daemon=True, name="unmask-ray-shutdown")
    t.start()
    t.join(timeout)
    if t.is_alive():  # stuck: kill what this process started, and leave without Ray's exit hooks (they would wait too)
        if node is not None:
            node.kill_all_processes(check_alive=False, allow_graceful=False)
        print("unmask: Ray did not stop in time; its processes were killed", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def add_parsers(sub) -> dict:
    """Add this module's commands to the subparsers; returns {name: function}."""
    sv = sub.add_parser("serve", help="OpenAI-compatible HTTP server with continuous batching and streaming")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    sv.add_argument("--port", type=int, default=8000)
    sv.add_argument("--served-model-name", default="unmask", help="the model name clients send")
    sv.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1")
    sv.add_argument("--max-num-seqs", type=int, default=64, help="requests decoded together")
    sv.add_argument("--max-num-batched-tokens", type=int, default=16384, help="positions computed per step")
    sv.add_argument("--max-waiting", type=int, default=1024, help="queued requests before 429")
    sv.add_argument("--scheduling", default="continuous",
                    help="continuous (requests join at the next step) or static (batches drain first; a baseline)")
    sv.add_argument("--prefix-cache-mb", type=float, default=256, metavar="MIB",
                    help="memory for prompt K/V shared across requests (block, AR, speculative and renoising models; "
                         "0: off; default 256)")
    sv.add_argument("--model", default=None, help=MODEL_HELP)
    sv.add_argument("--dtype", default=None, help="auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16, float16")
    sv.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    add_parallel_args(sv)
    add_draft_args(sv)
    r = sv.add_argument_group("replicas on Ray Serve", "Any of these serves through Ray Serve (pip install 'unmask[ray]').")
    r.add_argument("--replicas", type=int, default=None, metavar="N", help="engine replicas behind one endpoint")
    r.add_argument("--min-replicas", type=int, default=None, help="autoscale: fewest replicas")
    r.add_argument("--max-replicas", type=int, default=None, help="autoscale: most replicas")
    r.add_argument("--target-ongoing-requests", type=float, default=None,
                   help="autoscale: the ongoing requests per replica it aims at (default 8)")
    r.add_argument("--replica-cpus", type=float, default=None, help="CPUs each replica reserves (default 1)")
    r.add_argument("--replica-gpus", type=float, default=None,
                   help="GPUs each replica (each tensor-parallel rank) reserves (default 0)")
    r.add_argument("--ray-address", default=None, help="join this Ray cluster (default: start a local one)")
    return {"serve": cmd_serve}
