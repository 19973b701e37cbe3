"""``amp-rewrite check``: compare a mixed-precision model's outputs with the float32 model's."""

from __future__ import annotations

import argparse
from pathlib import Path

from amp_rewrite.cli.common import EXIT_CHECK_FAILED, EXIT_OK, check_writable, tolerance_arguments, tolerances
from amp_rewrite.errors import UserError
from amp_rewrite.inputs.samples import parse_shape
from amp_rewrite.ir.files import save_text
from amp_rewrite.numerics.check import DEFAULT_PROVIDER


def add_parser(commands) -> None:
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
    chk.add_argument("--deployed", action=argparse.BooleanOptionalAction, default=True,
                     help="also run the mixed model as ONNX Runtime deploys it, with its default graph "
                          "optimizations (a fusion can change a low-precision graph's numerics); each output is "
                          "judged by the worse run (default: on)")
    chk.add_argument("--localize", action="store_true",
                     help="on failure, rank the nodes where the error first grows")
    chk.add_argument("--report", metavar="REPORT.json", help="write the result as JSON")
    chk.add_argument("--junit", metavar="REPORT.xml", help="write the result as JUnit XML")
    tolerance_arguments(chk)


def run(args: argparse.Namespace) -> int:
    for path in (args.report, args.junit):
        if path:
            check_writable(Path(path))
    if args.random is not None and args.random < 1:
        raise UserError(f"--random must be at least 1, got {args.random}")
    default, per_output = tolerances(args)
    from amp_rewrite.workflows.check import check  # here, not at the top: every subcommand's start would pay for it
    result = check(args.original, args.mixed, inputs=args.inputs, random=args.random,
                   shapes=dict(parse_shape(s) for s in args.shape), tolerance=default, tolerances=per_output,
                   provider=args.provider, emulate=args.emulate, localize_failures=args.localize, seed=args.seed,
                   deployed=args.deployed)
    if result.fix:
        result.fix = f"amp-rewrite convert {args.original} -o {args.mixed} {result.fix}"
    print(result.table())
    if not result and not args.localize:
        print("--localize finds the nodes where the error grows")
    if args.report:
        save_text(Path(args.report), result.to_json())
    if args.junit:
        save_text(Path(args.junit), result.to_junit())
    return EXIT_OK if result else EXIT_CHECK_FAILED
