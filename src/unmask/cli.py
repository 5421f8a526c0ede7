"""Command line: `unmask generate [--model DIR] "prompt"`. Bad input exits with status 2 and a
one-line message naming the value."""

import argparse
import json
import sys

from unmask.errors import UnmaskError
from unmask.params import CACHE_NAMES, COMPAT_NAMES, CONFIDENCE_NAMES, DREAM_ALGS, POLICY_NAMES, REMASKING, GenerationParams

_D = GenerationParams()


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, status 2 (argparse prints usage first otherwise)
        raise UnmaskError(message)


def _add_decoding_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding")
    g.add_argument("--gen-length", type=int, default=_D.gen_length, help="tokens to generate (canvas length)")
    g.add_argument("--block-length", type=int, default=_D.block_length, help="denoising block length")
    g.add_argument("--steps", type=int, default=None, help="total steps of the fixed schedule (default: gen-length)")
    g.add_argument("--policy", default=_D.policy, help=f"commit policy: {', '.join(POLICY_NAMES)}")
    g.add_argument("--remasking", default=_D.remasking, help=f"fixed-policy order: {', '.join(REMASKING)}")
    g.add_argument("--confidence", default=_D.confidence, help=f"ranking score: {', '.join(CONFIDENCE_NAMES)}")
    g.add_argument("--threshold", type=float, default=_D.threshold, help="threshold policy: confidence bound")
    g.add_argument("--factor", type=float, default=_D.factor, help="factor policy: f")
    g.add_argument("--gamma", type=float, default=_D.gamma, help="entropy policy: entropy bound")
    g.add_argument("--budget", type=float, default=_D.budget, help="budget policy: error budget f")
    g.add_argument("--cache", default=_D.cache, help=f"KV cache: {', '.join(CACHE_NAMES)}")
    g.add_argument("--refresh-interval", type=int, default=None, help="refresh the cache every N steps in a block")
    g.add_argument("--temperature", type=float, default=_D.temperature)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--compat", default=None, help=f"reproduce a reference sampler: {', '.join(COMPAT_NAMES)}")
    g.add_argument("--alg", default=None, help=f"Dream algorithm with --compat dream: {', '.join(DREAM_ALGS)}")
    g.add_argument("--eps", type=float, default=_D.eps, help="Dream timestep floor with --compat dream")
    g.add_argument("--no-early-stop", action="store_true", help="decode the whole canvas even after end of text")


def params_from_args(a: argparse.Namespace) -> GenerationParams:
    return GenerationParams(
        gen_length=a.gen_length,
        block_length=a.block_length,
        steps=a.steps,
        policy=a.policy,
        remasking=a.remasking,
        confidence=a.confidence,
        threshold=a.threshold,
        factor=a.factor,
        gamma=a.gamma,
        budget=a.budget,
        cache=a.cache,
        refresh_interval=a.refresh_interval,
        temperature=a.temperature,
        top_k=a.top_k,
        top_p=a.top_p,
        seed=a.seed,
        compat=a.compat,
        alg=a.alg,
        eps=a.eps,
        early_stop=not a.no_early_stop,
    ).check()


def parse_prompt_ids(text: str) -> list[list[int]]:
    """'5,17,42;3,4' -> [[5, 17, 42], [3, 4]] (';' separates prompts of one batch)."""
    batch = []
    for part in text.split(";"):
        ids = []
        for tok in part.split(","):
            tok = tok.strip()
            try:
                ids.append(int(tok))
            except ValueError:
                raise UnmaskError(f"--prompt-ids: {tok!r} is not an integer token id") from None
        batch.append(ids)
    return batch


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="unmask", description="Fast inference for masked diffusion language models.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    g = sub.add_parser("generate", help="generate text for one prompt or a batch of token-id prompts")
    g.add_argument("prompt", nargs="?", help="prompt text")
    g.add_argument("--model", default=None, help="local checkpoint folder (LLaDA or Dream layout)")
    g.add_argument("--prompt-ids", default=None, help="token ids instead of text; ';' separates prompts")
    g.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="wrap the prompt in the chat template (default: when the tokenizer has one)")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.add_argument("--dtype", default=None, help="auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16, float16")
    g.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    _add_decoding_args(g)
    return parser


def cmd_generate(a: argparse.Namespace) -> int:
    if (a.prompt is None) == (a.prompt_ids is None):
        raise UnmaskError("give either a prompt text or --prompt-ids, not both and not neither")
    if a.prompt is not None and not a.prompt.strip():
        raise UnmaskError("empty prompt")
    params = params_from_args(a)
    from unmask.llm import LLM, default_device  # torch is imported only once arguments are valid

    llm = LLM(a.model, dtype=a.dtype, device=a.device or default_device())
    prompts = parse_prompt_ids(a.prompt_ids) if a.prompt_ids is not None else [a.prompt]
    out = llm.generate(prompts, params, chat=a.chat)
    tokens = sum(len(r.token_ids) + (r.finish_reason == "stop") for r in out.results)
    if a.json:
        exact = params.compat is not None  # compat modes return the whole canvas, like the reference
        print(json.dumps({
            "generated_ids": [r.raw_ids if exact else r.token_ids for r in out.results],
            "text": [r.text for r in out.results],
            "finish_reason": [r.finish_reason for r in out.results],
            "nfe": out.nfe,
            "row_nfe": [r.nfe for r in out.results],
            "commits": [r.commits for r in out.results],
            "tokens_per_forward": tokens / out.nfe if out.nfe else 0.0,
            "seconds": out.seconds,
            "cache": out.cache,
            "policy": params.policy,
        }))
    else:
        for r in out.results:
            print(r.text)
        per_fwd = tokens / max(out.nfe, 1)
        print(
            f"[unmask] nfe={out.nfe} tokens={tokens} tokens/forward={per_fwd:.2f} time={out.seconds:.2f}s "
            f"({tokens / max(out.seconds, 1e-9):.1f} tok/s) cache={out.cache} policy={params.policy}",
            file=sys.stderr,
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return {"generate": cmd_generate}[args.command](args)
    except UnmaskError as e:
        print(f"unmask: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
