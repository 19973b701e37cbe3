"""The ``amp-rewrite`` command: turns flags into ConvertOptions and calls the API."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__
from .check import DEFAULT_PROVIDER, check
from .compare import METRICS, Tolerance, parse_tolerance
from .convert import analyze, convert
from .errors import UserError
from .io import load, save_text
from .kernels import PROVIDERS
from .options import POLICIES, RANGE_CHECK_MODES, UNKNOWN_OP_MODES, ConvertOptions
from .precision import Precision
from .samples import parse_shape

EXIT_OK, EXIT_CHECK_FAILED, EXIT_USER_ERROR, EXIT_INTERNAL = 0, 1, 2, 3


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


def _tolerance_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tolerance")
    group.add_argument("--rtol", type=float, default=Tolerance.rtol, help="relative tolerance (default %(default)g)")
    group.add_argument("--atol", type=float, default=Tolerance.atol, help="absolute tolerance (default %(default)g)")
    group.add_argument("--tol", action="append", default=[], metavar="OUTPUT:RTOL:ATOL",
                       help="tolerance for one output")
    group.add_argument("--metric", choices=METRICS, default=Tolerance.metric,
                       help="the statistic the tolerance applies to (default %(default)s)")


def _tolerances(args: argparse.Namespace) -> tuple[Tolerance, dict[str, Tolerance]]:
    default = Tolerance(args.rtol, args.atol, args.metric)
    return default, dict(parse_tolerance(t, default) for t in args.tol)


def _options(args: argparse.Namespace) -> ConvertOptions:
    extra = {}
    if args.command == "convert":
        default, per_output = _tolerances(args)
        extra = dict(calibrate=args.calibrate, validate=args.validate, tolerance=default, tolerances=per_output,
                     headroom=args.headroom, flush_share=args.flush_share)
    return ConvertOptions(
        precision=args.precision, provider=None if args.provider == "none" else args.provider,
        keep_io_types=args.keep_io_types, keep_fp32_ops=args.keep_fp32_op, keep_fp32_nodes=args.keep_fp32_node,
        force_low_ops=args.force_low_op, force_low_nodes=args.force_low_node, unknown_ops=args.unknown_ops,
        policy=args.policy, range_check=args.range_check, **extra,
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
    numerics = conv.add_argument_group("numerics")
    numerics.add_argument("--calibrate", nargs="+", default=[], metavar="DATA.npz",
                          help="measure the float32 model's values on these samples and keep in float32 "
                               "what overflows or flushes to zero")
    numerics.add_argument("--validate", nargs="+", default=[], metavar="DATA.npz",
                          help="check the result on these samples (emulating the target precision) and keep "
                               "in float32 the nodes localization blames until it passes")
    numerics.add_argument("--headroom", type=float, default=ConvertOptions.headroom,
                          help="a value counts as overflowing beyond precision max / headroom (default %(default)g)")
    numerics.add_argument("--flush-share", type=float, default=ConvertOptions.flush_share,
                          help="calibration: keep a value float32 when more than this share of its nonzero "
                               "elements flush to zero (default %(default)g)")
    _tolerance_arguments(conv)
    insp = commands.add_parser("inspect", help="print the coloring and its reasons; nothing is written")
    insp.add_argument("input")
    insp.add_argument("--explain", metavar="NODE", help="explain one node's decision")
    insp.add_argument("--json", action="store_true", help="print the decisions as JSON")
    _coloring_arguments(insp)
    chk = commands.add_parser("check", help="compare a mixed-precision model's outputs with the float32 model's")
    chk.add_argument("original", help="the float32 model")
    chk.add_argument("mixed", help="the mixed-precision model")
    chk.add_argument("--inputs", action="append", default=[], metavar="DATA.npz",
                     help="one sample, keyed by input name (repeat for more)")
    chk.add_argument("--random", type=int, metavar="N",
                     help="also run N generated samples (default 1 without --inputs)")
    chk.add_argument("--shape", action="append", default=[], metavar="NAME:DIMS",
                     help="shape of a generated input, e.g. input_ids:1x128")
    chk.add_argument("--seed", type=int, default=0, help="seed of generated inputs")
    chk.add_argument("--provider", default=DEFAULT_PROVIDER,
                     help="execution provider that runs both models (default %(default)s)")
    chk.add_argument("--emulate", action=argparse.BooleanOptionalAction, default=None,
                     help="round every low-precision value as the GPU would store it, on a float32 runtime "
                          "(default: on unless the provider runs float16 natively)")
    chk.add_argument("--localize", action="store_true",
                     help="on failure, rank the nodes where the error first grows")
    chk.add_argument("--report", metavar="REPORT.json", help="write the result as JSON")
    chk.add_argument("--junit", metavar="REPORT.xml", help="write the result as JUnit XML")
    _tolerance_arguments(chk)
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
    if args.command == "check":
        return _check(args)
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
        if report.validation is not None and not report.validation.passed:
            print("amp-rewrite: validation failed: the written model is out of tolerance", file=sys.stderr)
            return EXIT_CHECK_FAILED
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


def _check(args: argparse.Namespace) -> int:
    for path in (args.report, args.junit):
        if path:
            _check_writable(Path(path))
    if args.random is not None and args.random < 1:
        raise UserError(f"--random must be at least 1, got {args.random}")
    default, per_output = _tolerances(args)
    result = check(args.original, args.mixed, inputs=args.inputs, random=args.random,
                   shapes=dict(parse_shape(s) for s in args.shape), tolerance=default, tolerances=per_output,
                   provider=args.provider, emulate=args.emulate, localize_failures=args.localize, seed=args.seed)
    if result.fix:
        result.fix = f"amp-rewrite convert {args.original} -o {args.mixed} {result.fix}"
    print(result.table())
    if args.report:
        save_text(Path(args.report), result.to_json())
    if args.junit:
        save_text(Path(args.junit), result.to_junit())
    return EXIT_OK if result else EXIT_CHECK_FAILED


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
