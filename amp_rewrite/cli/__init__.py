"""The ``amp-rewrite`` command: one module per subcommand, each turning flags into an API call."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from amp_rewrite import __version__
from amp_rewrite.cli import bench, check, convert, grad, inspect, train, train_graph
from amp_rewrite.cli.common import EXIT_BROKEN_PIPE, EXIT_INTERNAL, EXIT_USER_ERROR, Parser
from amp_rewrite.errors import UserError, printable

SUBCOMMANDS = {"convert": convert, "inspect": inspect, "check": check, "grad": grad, "train-graph": train_graph,
               "train": train, "bench": bench}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="amp-rewrite", description="Rewrite ONNX models to mixed precision.")
    parser.add_argument("--version", action="version", version=f"amp-rewrite {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in SUBCOMMANDS.values():
        module.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return SUBCOMMANDS[args.command].run(args)
    except UserError as exc:
        print(f"amp-rewrite: error: {printable(str(exc))}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("amp-rewrite: interrupted", file=sys.stderr)
        return EXIT_USER_ERROR
    except BrokenPipeError:  # the reader of the output went away (``| head``): nothing left to say
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (what is still buffered goes nowhere)
        return EXIT_BROKEN_PIPE
    except Exception as exc:  # a bug: one line unless the user asks for the traceback
        if os.environ.get("AMP_REWRITE_DEBUG"):
            raise
        print(f"amp-rewrite: internal error: {type(exc).__name__}: {printable(str(exc))} "
              "(set AMP_REWRITE_DEBUG=1 for the traceback)", file=sys.stderr)
        return EXIT_INTERNAL


def entry() -> NoReturn:
    """The ``amp-rewrite`` process: ``main()``, then its exit code once what it printed is out,
    without the interpreter's teardown, which would free a conversion's objects one by one, as the
    process exits anyway. Files are written and renamed, and children settled, before ``main`` returns."""
    code = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more reaches the reader
            code = code or EXIT_INTERNAL
    os._exit(code)


if __name__ == "__main__":
    entry()
