"""`unmask serve`."""

import argparse
import sys

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
                          max_waiting=a.max_waiting, scheduling=a.scheduling)
    if a.replicas is not None or a.min_replicas is not None or a.max_replicas is not None:
        return _serve_ray(a, config)
    llm = load_llm(a)
    app = build_app(llm, a.served_model_name, a.api_key, config)
    print(f"unmask: serving {a.served_model_name} ({llm.path}) on http://{a.host}:{a.port} "
          f"(playground at /, OpenAI API under /v1)", file=sys.stderr)
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning")
    return 0


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
    for flag in ("replica_cpus", "replica_gpus", "target_ongoing_requests"):
        if getattr(a, flag) < 0:
            raise UnmaskError(f"--{flag.replace('_', '-')} {getattr(a, flag)} must not be negative")
    from unmask.llm import default_device
    from unmask.loading import resolve_model_path
    from unmask.models.loader import read_json
    from unmask.models.registry import resolve_family

    path = resolve_model_path(a.model)  # checked here, before any replica starts (each node reads this path)
    if not path.is_dir():
        raise UnmaskError(f"model folder {path} does not exist")
    resolve_family(read_json(path / "config.json"))
    model = str(path)
    draft = None if a.draft is None else str(resolve_model_path(a.draft))
    # without --ray-address a new local instance (never one another program started here)
    ray.init(address=a.ray_address or "local", include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": a.host, "port": a.port})
    engine = {"max_num_seqs": config.max_num_seqs, "max_num_batched_tokens": config.max_num_batched_tokens,
              "max_waiting": config.max_waiting, "scheduling": config.scheduling}
    app = build(model, replicas=a.replicas or 1, min_replicas=a.min_replicas, max_replicas=a.max_replicas,
                target_ongoing_requests=a.target_ongoing_requests, replica_cpus=a.replica_cpus,
                replica_gpus=a.replica_gpus, dtype=a.dtype, device=a.device or default_device(),
                tensor_parallel=a.tensor_parallel, served_model_name=a.served_model_name, api_key=a.api_key,
                engine=engine, draft=draft, quantize=a.quantize, linear_kernel=a.linear_kernel)
    print(f"unmask: serving {a.served_model_name} ({model}) on Ray Serve at http://{a.host}:{a.port} "
          f"({'autoscaled' if a.replicas is None else a.replicas} replicas; Ray at "
          f"{ray.get_runtime_context().gcs_address})", file=sys.stderr)
    try:
        serve.run(app, name="unmask", route_prefix="/", blocking=True)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()  # graceful: replicas finish their requests within their shutdown timeout
        ray.shutdown()
    return 0


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
    sv.add_argument("--model", default=None, help=MODEL_HELP)
    sv.add_argument("--dtype", default=None, help="auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16, float16")
    sv.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    add_parallel_args(sv)
    add_draft_args(sv)
    r = sv.add_argument_group("replicas on Ray Serve", "Any of these serves through Ray Serve (pip install 'unmask[ray]').")
    r.add_argument("--replicas", type=int, default=None, metavar="N", help="engine replicas behind one endpoint")
    r.add_argument("--min-replicas", type=int, default=None, help="autoscale: fewest replicas")
    r.add_argument("--max-replicas", type=int, default=None, help="autoscale: most replicas")
    r.add_argument("--target-ongoing-requests", type=float, default=8.0,
                   help="autoscale: the ongoing requests per replica it aims at (default 8)")
    r.add_argument("--replica-cpus", type=float, default=1.0, help="CPUs each replica reserves (default 1)")
    r.add_argument("--replica-gpus", type=float, default=0.0, help="GPUs each replica (each tensor-parallel rank) reserves")
    r.add_argument("--ray-address", default=None, help="join this Ray cluster (default: start a local one)")
    return {"serve": cmd_serve}
