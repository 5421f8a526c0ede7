"""`unmask serve`."""

import argparse
import sys

from unmask.cli.common import MODEL_HELP, add_parallel_args, load_llm
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
    llm = load_llm(a)
    app = build_app(llm, a.served_model_name, a.api_key, config)
    print(f"unmask: serving {a.served_model_name} ({llm.path}) on http://{a.host}:{a.port} "
          f"(playground at /, OpenAI API under /v1)", file=sys.stderr)
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning")
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
    return {"serve": cmd_serve}
