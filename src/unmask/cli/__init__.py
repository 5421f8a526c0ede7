"""Command line: `unmask generate [--model DIR] "prompt"`. Bad input exits with status 2 and a
one-line message naming the value; a bug exits with status 1 and one line.

The decoding flags are generated from GenerationParams' fields (unmask.params), so every knob
has exactly one definition. `generate` runs unmask's fast defaults (what the checkpoint's
generation_config.json recommends, else threshold 0.9 with DualCache); `eval`, `gsm8k` and
`humaneval` run the reference setting (one token per step, no cache) unless told otherwise.
One module per group of commands: models, decode, train, measure, serve; common holds what they share.
"""

import argparse
import os
import sys
import warnings

from unmask.cli import decode, evaluate, measure, models, serve, train
from unmask.cli.common import Parser, params_from_args
from unmask.errors import UnmaskError, UnmaskWarning

__all__ = ["main", "build_parser", "params_from_args", "COMMANDS"]
COMMANDS: dict = {}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="unmask", description="Fast inference for masked diffusion language models.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for group in (models, decode, evaluate, train, measure, serve):
        for name, fn in group.add_parsers(sub).items():
            COMMANDS.setdefault(name, fn)
    return parser


build_parser()  # fills COMMANDS


def _format_warning(message, category, filename, lineno, line=None) -> str:
    if issubclass(category, UnmaskWarning):
        return f"unmask: warning: {message}\n"
    return _plain_format(message, category, filename, lineno, line)


_plain_format = warnings.formatwarning


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    warnings.formatwarning = _format_warning
    try:
        if argv[:1] == ["lm-eval"]:  # everything after it belongs to lm-eval's own parser
            return evaluate.cmd_lm_eval(argparse.Namespace(args=argv[1:]))
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except UnmaskError as e:
        print(f"unmask: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into `head` and closed: not an error
        sys.stderr.close()
        return 0
    except Exception as e:  # a bug, not bad input: one line, status 1; the traceback on request
        if os.environ.get("UNMASK_DEBUG"):
            raise
        print(f"unmask: internal error: {type(e).__name__}: {e} (a bug; UNMASK_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 1
