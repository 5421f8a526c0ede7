"""`unmask generate`: one prompt or a batch, a template with holes, structured output."""

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from unmask import holes
from unmask.cli.common import (
    FAST_TEXT,
    add_decoding_args,
    add_model_args,
    given_params,
    load_llm,
    params_for,
    parse_prompt_ids,
)
from unmask.constrain import Constraint
from unmask.errors import UnmaskError


def cmd_generate(a: argparse.Namespace) -> int:
    template = _template(a)
    if template is None and (a.prompt is None) == (a.prompt_ids is None):
        raise UnmaskError("give either a prompt text or --prompt-ids, not both and not neither")
    if a.prompt is not None and not a.prompt.strip():
        raise UnmaskError("empty prompt")
    if a.suffix is not None and (a.prompt is None or template is not None):
        raise UnmaskError("--suffix goes with a text prompt (the text before the hole), not with "
                          f"{'--prompt-ids' if template is None else 'a template'}")
    if a.chat and (a.suffix is not None or template is not None):
        raise UnmaskError("--chat wraps the prompt in the chat template; infilling reads the text before the hole "
                          "as it is")
    constraint = _constraint(a)
    if constraint is not None and (a.suffix is not None or template is not None):
        raise UnmaskError("--json-schema / --regex / --choice / --grammar constrain an answer written from its start; "
                          "not with --suffix or a template")
    given_params(a)  # reject a bad flag before loading anything
    llm = load_llm(a)
    params = params_for(llm, a, fast=True)
    if template is not None:
        out = llm.infill(template, params)
    else:
        prompts = parse_prompt_ids(a.prompt_ids) if a.prompt_ids is not None else [a.prompt]
        out = llm.generate(prompts, params, chat=False if a.suffix is not None else a.chat, suffix=a.suffix,
                           constraint=constraint)
    policy = llm.takes.decodes or params.policy  # autoregressive / speculative rows follow no commit policy
    if a.json:
        exact = params.compat is not None  # compat modes return the whole canvas, like the reference
        print(json.dumps({
            "generated_ids": [r.raw_ids if exact else r.token_ids for r in out.results],
            "text": [r.text for r in out.results],
            "finish_reason": [r.finish_reason for r in out.results],
            "nfe": out.nfe,
            "row_nfe": [r.nfe for r in out.results],
            "commits": [r.commits for r in out.results],
            "edits": [r.edits for r in out.results],
            "remasked": [r.remasked for r in out.results],
            "tokens_per_forward": out.tokens_per_forward,
            "draft_forwards": out.draft_forwards,
            "seconds": out.seconds,
            "cache": out.cache,
            "policy": policy,
            "params": asdict(params),
            **({"holes": [r.holes for r in out.results],
                "filled": [holes.fill_in(template, r.holes) for r in out.results]} if template is not None else {}),
        }))
    else:
        for r in out.results:
            print(r.text if template is None else holes.fill_in(template, r.holes))
        print(f"[unmask] nfe={out.nfe} tokens={out.tokens} tokens/forward={out.tokens_per_forward:.2f} "
              f"time={out.seconds:.2f}s ({out.tokens / max(out.seconds, 1e-9):.1f} tok/s) cache={out.cache} "
              f"policy={policy}" + (f" draft_forwards={out.draft_forwards}" if llm.drafter is not None else ""),
              file=sys.stderr)
    return 0


def _read_text(path: str, flag: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UnmaskError(f"{flag} {path}: cannot read it as UTF-8 text ({type(e).__name__})") from None


def _constraint(a: argparse.Namespace) -> Constraint | None:
    """Structured output from --json-schema FILE, --regex R, --choice A,B or --grammar FILE (one of them)."""
    given = [(k, v) for k, v in (("json", a.json_schema), ("regex", a.regex), ("choice", a.choice),
                                 ("grammar", a.grammar)) if v is not None]
    if len(given) > 1:
        raise UnmaskError("give one of --json-schema, --regex, --choice and --grammar")
    if not given:
        return None
    kind, value = given[0]
    if kind == "json":
        return Constraint.json_schema(_read_text(value, "--json-schema"))
    if kind == "grammar":
        return Constraint.grammar(_read_text(value, "--grammar"))
    if kind == "choice":
        return Constraint.choice([c.strip() for c in value.split(",")])
    return Constraint.regex(value)


def _template(a: argparse.Namespace) -> str | None:
    """The template text of --template (the prompt) or --template-file, or None."""
    if a.template_file is not None:
        if a.template or a.prompt is not None or a.prompt_ids is not None:
            raise UnmaskError("--template-file is the whole input; give no prompt, --prompt-ids or --template with it")
        try:
            return Path(a.template_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UnmaskError(f"--template-file {a.template_file}: cannot read it as UTF-8 text "
                              f"({e.strerror if isinstance(e, OSError) else e.reason})") from None
    if a.template:
        if a.prompt is None:
            raise UnmaskError("--template reads the prompt text as a template; give the prompt text")
        if a.prompt_ids is not None:
            raise UnmaskError("--template reads the prompt text as a template; --prompt-ids cannot be one "
                              "(give the template as text)")
        return a.prompt
    return None


def add_parsers(sub) -> dict:
    """Add this module's commands to the subparsers; returns {name: function}."""
    g = sub.add_parser("generate", help="generate text for one prompt or a batch of token-id prompts")
    g.add_argument("prompt", nargs="?", help="prompt text")
    g.add_argument("--prompt-ids", default=None, help="token ids instead of text; ';' separates prompts")
    g.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="wrap the prompt in the chat template (default: when the tokenizer has one)")
    g.add_argument("--suffix", default=None,
                   help="infilling: text after the hole (the prompt is the text before it, --gen-length the hole)")
    g.add_argument("--template", action="store_true",
                   help="the prompt is a template with holes: <|hole:N|> (N tokens) or <|hole|> (--gen-length); "
                        "prints it filled")
    g.add_argument("--template-file", default=None, metavar="PATH", help="read the template from a file")
    so = g.add_argument_group("structured output (docs/structured-output.md)")
    so.add_argument("--json-schema", default=None, metavar="FILE", help="the answer is JSON valid against this schema")
    so.add_argument("--regex", default=None, metavar="R", help="the answer matches this regular expression")
    so.add_argument("--choice", default=None, metavar="A,B", help="the answer is one of these comma-separated strings")
    so.add_argument("--grammar", default=None, metavar="FILE",
                    help="the answer is a word of this Lark grammar (llguidance's dialect; GBNF is converted)")
    add_model_args(g)
    add_decoding_args(g, FAST_TEXT)
    return {"generate": cmd_generate}
