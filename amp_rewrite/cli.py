"""The ``amp-rewrite`` command: turns flags into ConvertOptions and calls the API."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__
from .convert import analyze, convert
from .errors import UserError
from .io import load, save_text
from .kernels import PROVIDERS
from .options import POLICIES, RANGE_CHECK_MODES, UNKNOWN_OP_MODES, ConvertOptions
from .precision import Precision

EXIT_OK, EXIT_USER_ERROR, EXIT_INTERNAL = 0, 2, 3


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        raise UserError(message)


def _coloring_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("coloring")
    group.add_argument("--precision", choices=[p.value for p in Precision], default="float16")
    group.add_argument("--provider", choices=[*PROVIDERS, "none"], default="CUDAExecutionProvider",
                       help="execution provider whose kernels decide what may run in low precision; "
                            "'none' follows the ONNX schemas alone")
    group.add_argument("--keep-io-types", action=argparse.BooleanOptionalAction, default=True,
                       help="graph inputs and outputs stay float32 (default: on)")
    group.add_argument("--keep-fp32-op", action="append", default=[], metavar="OP")
    group.add_argument("--keep-fp32-node", action="append", default=[], metavar="NAME_OR_REGEX")
    group.add_argument("--force-low-op", action="append", default=[], metavar="OP")
    group.add_argument("--force-low-node", action="append", default=[], metavar="NAME_OR_REGEX")
    group.add_argument("--unknown-ops", choices=UNKNOWN_OP_MODES, default="keep",
                       help="ops the lists don't know: keep float32, warn, or error")
    group.add_argument("--policy", choices=POLICIES, default="default",
                       help="'all-low' puts every convertible node in low precision, as other converters do")
    group.add_argument("--range-check", choices=RANGE_CHECK_MODES, default="auto",
                       help="run the model on generated inputs and keep overflowing values float32")


def _options(args: argparse.Namespace) -> ConvertOptions:
    return ConvertOptions(
        precision=args.precision, provider=None if args.provider == "none" else args.provider,
        keep_io_types=args.keep_io_types, keep_fp32_ops=args.keep_fp32_op, keep_fp32_nodes=args.keep_fp32_node,
        force_low_ops=args.force_low_op, force_low_nodes=args.force_low_node, unknown_ops=args.unknown_ops,
        policy=args.policy, range_check=args.range_check,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="amp-rewrite", description="Rewrite ONNX models to mixed precision.")
    parser.add_argument("--version", action="version", version=f"amp-rewrite {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    conv = commands.add_parser("convert", help="rewrite a model to mixed precision")
    conv.add_argument("input", help="the float32 ONNX model")
    conv.add_argument("-o", "--output", required=True, help="where to write the mixed-precision model")
    conv.add_argument("--report", metavar="REPORT.json", help="write the full report as JSON")
    conv.add_argument("--quiet", action="store_true", help="print nothing on success")
    _coloring_arguments(conv)
    insp = commands.add_parser("inspect", help="print the coloring and its reasons; nothing is written")
    insp.add_argument("input")
    insp.add_argument("--explain", metavar="NODE", help="explain one node's decision")
    insp.add_argument("--json", action="store_true", help="print the decisions as JSON")
    _coloring_arguments(insp)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return _run(args)
    except UserError as exc:
        print(f"amp-rewrite: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("amp-rewrite: interrupted", file=sys.stderr)
        return EXIT_USER_ERROR
    except Exception as exc:  # a bug: one line unless the user asks for the traceback
        if os.environ.get("AMP_REWRITE_DEBUG"):
            raise
        print(f"amp-rewrite: internal error: {type(exc).__name__}: {exc} "
              "(set AMP_REWRITE_DEBUG=1 for the traceback)", file=sys.stderr)
        return EXIT_INTERNAL


def _run(args: argparse.Namespace) -> int:
    options = _options(args)
    if args.command == "convert":
        if args.report:
            _check_writable(Path(args.report))
        _, report = convert(args.input, args.output, options)
        if args.report:
            save_text(Path(args.report), report.to_json())
        if not args.quiet:
            print(report.summary())
            print(f"  wrote {args.output}")
        return EXIT_OK
    model = load(args.input)
    analysis = analyze(model, options, os.path.dirname(os.path.abspath(args.input)))
    rows = [(n.label, n.op_type, d.op_class, (d.color.value if d.color else "fp32"), d.reason)
            for n, d in ((analysis.index.nodes[i], d) for i, d in sorted(analysis.coloring.decisions.items()))]
    if args.explain:
        print(_explain(analysis, args.explain))
    elif args.json:
        print(json.dumps([dict(zip(("node", "op_type", "class", "precision", "reason"), r)) for r in rows], indent=1))
    else:
        width = max((len(r[0]) for r in rows), default=4)
        for name, op, cls, color, reason in rows:
            print(f"{name:<{width}}  {op:<20} {cls:<7} {color:<4}  {reason}")
        print(f"{sum(r[3] == 'low' for r in rows)} of {len(rows)} float nodes in {options.precision}; "
              f"range check: {analysis.range_check}")
    return EXIT_OK


def _explain(analysis, wanted: str) -> str:
    index = analysis.index
    node = next((n for n in index.nodes if n.proto.name == wanted or n.label == wanted), None)
    if node is None:
        raise UserError(f"no node named {wanted!r} in the model")
    decision = analysis.coloring.decisions.get(node.id)
    lines = [f"node {node.label} ({node.domain + '.' if node.domain else ''}{node.op_type}, "
             f"opset {index.opset(node)})"]
    if decision is None:
        lines.append("  not a candidate: no float32 input or output it could change "
                     "(no schema type parameter admitting the target type)")
        return "\n".join(lines)
    lines.append(f"  class: {decision.op_class}")
    decided_by = "min cut over its neighbours" if decision.free else decision.priority.name.lower()
    lines.append(f"  precision: {(decision.color.value if decision.color else 'fp32')} (decided by {decided_by})")
    lines.append(f"  reason: {decision.reason}")
    slots = analysis.slots[node.id]
    for label, keys, chosen in (("input", node.inputs, slots.inputs), ("output", node.outputs, slots.outputs)):
        for i, key in enumerate(keys):
            if key is not None:
                mark = "converted with the node" if i in chosen else "keeps its type"
                lines.append(f"  {label} {i}: {key[1]} ({mark})")
    return "\n".join(lines)


def _check_writable(path: Path) -> None:
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise UserError(f"cannot write the report: folder {folder} does not exist or is not writable")


if __name__ == "__main__":
    sys.exit(main())
