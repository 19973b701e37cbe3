"""``amp-rewrite convert``: rewrite a saved model to mixed precision."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from amp_rewrite.cli.common import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    check_writable,
    coloring_arguments,
    convert_options,
    tolerance_arguments,
)
from amp_rewrite.errors import printable
from amp_rewrite.ir.files import save_text
from amp_rewrite.rewrite.options import ConvertOptions
from amp_rewrite.workflows.convert import convert


def add_parser(commands) -> None:
    conv = commands.add_parser("convert", help="rewrite a model to mixed precision")
    conv.add_argument("input", help="the float32 ONNX model")
    conv.add_argument("-o", "--output", required=True, help="where to write the mixed-precision model")
    conv.add_argument("--report", metavar="REPORT.json", help="write the full report as JSON")
    conv.add_argument("--quiet", action="store_true", help="print nothing on success")
    coloring_arguments(conv)
    numerics = conv.add_argument_group("numerics")
    numerics.add_argument("--shape", action="append", default=[], metavar="NAME:DIMS",
                          help="range check: shape of a generated input, e.g. input_ids:1x128 (repeatable; "
                               "default: what the graph implies, named dimensions otherwise 8)")
    numerics.add_argument("--inputs", action="append", default=[], metavar="DATA.npz",
                          help="range check: run it on this sample, keyed by input name, instead of generated "
                               "inputs (repeatable); judges overflow only, unlike --calibrate")
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
    conv.add_argument("--opset", type=int, metavar="N",
                      help="upgrade the model to this opset first (bfloat16 upgrades a model below opset 13 by itself)")
    conv.add_argument("--ir-version", type=int, metavar="N",
                      help="the IR version the output declares (default: the input's), for a runtime that reads "
                           "only older ones")
    tolerance_arguments(conv)


def run(args: argparse.Namespace) -> int:
    options = convert_options(args)
    if args.report:
        check_writable(Path(args.report))
    _, report = convert(args.input, args.output, options)
    if args.report:
        save_text(Path(args.report), report.to_json())
    if not args.quiet:
        print(report.summary())
        print(f"  wrote {args.output}")
    for note in report.notes:  # warnings reach the terminal even with --quiet, on stderr
        if note.startswith("warning:"):
            print(f"amp-rewrite: {printable(note)}", file=sys.stderr)
    if report.validation is not None and not report.validation.passed:
        print("amp-rewrite: validation failed: the written model is out of tolerance", file=sys.stderr)
        return EXIT_CHECK_FAILED
    return EXIT_OK
