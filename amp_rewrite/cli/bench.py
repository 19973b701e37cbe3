"""``amp-rewrite bench``: time a model in float32 and mixed precision, and say whether it pays."""

from __future__ import annotations

import argparse
from pathlib import Path

from amp_rewrite.cli.common import EXIT_OK, check_writable
from amp_rewrite.errors import UserError
from amp_rewrite.inputs.samples import parse_shape
from amp_rewrite.ir.files import save_text


def add_parser(commands) -> None:
    cmd = commands.add_parser("bench", help="time a model in float32 and in mixed precision; say whether it pays")
    cmd.add_argument("model", help="the float32 model")
    cmd.add_argument("mixed", nargs="*", help="mixed-precision models to time (default: convert the model first)")
    cmd.add_argument("--provider", help="execution provider (default: CUDA where a GPU is there, else CPU)")
    cmd.add_argument("--inputs", action="append", default=[], metavar="DATA.npz",
                     help="one sample, keyed by input name (repeat for more)")
    cmd.add_argument("--random", type=int, metavar="N", help="also time on N generated samples "
                                                             "(default 1 without --inputs)")
    cmd.add_argument("--shape", action="append", default=[], metavar="NAME:DIMS",
                     help="shape of a generated input, e.g. input_ids:32x128")
    cmd.add_argument("--seed", type=int, default=0, help="seed of generated inputs")
    cmd.add_argument("--warmup", type=int, default=10, help="untimed runs first (default %(default)s)")
    cmd.add_argument("--runs", type=int, default=100, help="timed runs per model (default %(default)s)")
    cmd.add_argument("--profile-runs", type=int, default=10,
                     help="runs under ONNX Runtime's profiler for the breakdown; 0 skips it (default %(default)s)")
    cmd.add_argument("--report", metavar="REPORT.json", help="write the result as JSON")


def run(args: argparse.Namespace) -> int:
    if args.report:
        check_writable(Path(args.report))
    if args.random is not None and args.random < 1:
        raise UserError(f"--random must be at least 1, got {args.random}")
    from amp_rewrite.workflows.bench import bench  # here, not at the top: every subcommand's start would pay for it
    result = bench(args.model, args.mixed, provider=args.provider, inputs=args.inputs, random=args.random,
                   shapes=dict(parse_shape(s) for s in args.shape), warmup=args.warmup, runs=args.runs,
                   profile_runs=args.profile_runs, seed=args.seed)
    print(result.table())
    if args.report:
        save_text(Path(args.report), result.to_json())
    return EXIT_OK
