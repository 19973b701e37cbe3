"""What the subcommands share: exit codes, the one-line-error parser, argument groups."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import NoReturn

from amp_rewrite.errors import UserError
from amp_rewrite.inputs.samples import parse_shape
from amp_rewrite.ir.precision import Precision
from amp_rewrite.numerics.compare import METRICS, PRECISION_DEFAULTS, Tolerance, parse_tolerance
from amp_rewrite.policy.kernels import PROVIDERS
from amp_rewrite.rewrite.options import POLICIES, RANGE_CHECK_MODES, UNKNOWN_OP_MODES, ConvertOptions

EXIT_OK, EXIT_CHECK_FAILED, EXIT_USER_ERROR, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_BROKEN_PIPE = 128 + 13
"""What a shell reports for a writer whose reader closed the pipe (SIGPIPE): ``amp-rewrite convert ... | head``."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2
        raise UserError(message)


def coloring_arguments(parser: argparse.ArgumentParser, float32: bool = False) -> None:
    """The rewrite's options; ``float32`` also offers --precision float32 (no rewrite: training)."""
    group = parser.add_argument_group("coloring")
    group.add_argument("--precision", choices=[p.value for p in Precision] + (["float32"] if float32 else []),
                       default="float16")
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


def tolerance_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tolerance")
    defaults = ", ".join(f"{value:g} for {precision}" for precision, value in PRECISION_DEFAULTS.items())
    group.add_argument("--rtol", type=float, help=f"relative tolerance (default {defaults})")
    group.add_argument("--atol", type=float, help=f"absolute tolerance (default {defaults})")
    group.add_argument("--tol", action="append", default=[], metavar="OUTPUT:RTOL:ATOL",
                       help="tolerance for one output")
    group.add_argument("--metric", choices=METRICS, default=Tolerance.metric,
                       help="the statistic the tolerance applies to (default %(default)s)")


def tolerances(args: argparse.Namespace) -> tuple[Tolerance, dict[str, Tolerance]]:
    default = Tolerance(args.rtol, args.atol, args.metric)
    return default, dict(parse_tolerance(t, default) for t in args.tol)


def convert_options(args: argparse.Namespace) -> ConvertOptions:
    extra = {}
    if args.command == "convert":
        default, per_output = tolerances(args)
        extra = dict(calibrate=args.calibrate, validate=args.validate, tolerance=default, tolerances=per_output,
                     headroom=args.headroom, flush_share=args.flush_share, inputs=args.inputs,
                     shapes=dict(parse_shape(s) for s in args.shape), ir_version=args.ir_version,
                     opset=args.opset)
    return ConvertOptions(
        precision=args.precision, provider=None if args.provider == "none" else args.provider,
        keep_io_types=args.keep_io_types, keep_fp32_ops=args.keep_fp32_op, keep_fp32_nodes=args.keep_fp32_node,
        force_low_ops=args.force_low_op, force_low_nodes=args.force_low_node, unknown_ops=args.unknown_ops,
        policy=args.policy, range_check=args.range_check, **extra,
    )


def check_writable(path: Path) -> None:
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise UserError(f"cannot write the report: folder {folder} does not exist or is not writable")


def step_options(args: argparse.Namespace):
    """The ``StepOptions`` the training step's flags (``training_arguments``) describe."""
    from amp_rewrite.training.options import StepOptions  # the training layers: only for these commands

    return StepOptions(loss=args.loss, output=args.output, labels=args.labels, params=args.param,
                       train=args.train_patterns, freeze=args.freeze_patterns, optimizer=args.optimizer,
                       precision=args.precision, loss_scale=args.loss_scale, clip_norm=args.clip_norm,
                       accumulate=args.accumulate, batchnorm=args.batchnorm, conv_weight_grad=args.conv_weight_grad,
                       flat_state=args.flat_state, convert=convert_options(args))


def training_arguments(parser: argparse.ArgumentParser) -> None:
    """What defines a training step: the loss, the optimizer, precision and loss scaling."""
    group = parser.add_argument_group("training step")
    group.add_argument("--loss", required=True, metavar="NAME|cross-entropy|mse",
                       help="a scalar float output of the model, or a standard loss on --output with --labels")
    group.add_argument("--output", metavar="NAME", help="the model output a standard loss applies to")
    group.add_argument("--labels", default="labels", metavar="NAME", help="name of the labels input (default labels)")
    group.add_argument("--param", action="append", metavar="NAME",
                       help="an initializer to train; repeat for more (default: every float weight the loss reads, but "
                            "frozen running statistics and one-element constants: epsilons, scales)")
    group.add_argument("--train", dest="train_patterns", action="append", default=[], metavar="REGEX",
                       help="train only the parameters whose name, or a reading node's name, this finds (repeatable)")
    group.add_argument("--freeze", dest="freeze_patterns", action="append", default=[], metavar="REGEX",
                       help="do not train the parameters whose name, or a reading node's name, this finds "
                            "(repeatable): a head fine-tuned on a frozen backbone")
    group.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    group.add_argument("--clip-norm", type=float, metavar="N",
                       help="clip the gradients' global L2 norm to N (in the graph, in float32, after unscaling)")
    group.add_argument("--accumulate", type=int, default=1, metavar="N",
                       help="sum the gradients of N micro-batches (steps of --batch-size) into one update: the "
                            "update of a batch N times larger, in the memory of one")
    group.add_argument("--loss-scale", metavar="dynamic|none|N",
                       help="dynamic loss scaling (the default for float16), none (the default otherwise), "
                            "or a static scale")
    group.add_argument("--batchnorm", choices=("auto", "train", "freeze"), default="auto",
                       help="BatchNormalization on batch statistics with running ones updated (train), or on its "
                            "running ones, kept (freeze); auto (default): freeze trained statistics, train ones "
                            "that hold their initial values")
    group.add_argument("--conv-weight-grad", default="direct", metavar="direct|auto|grouped|transposed|im2col",
                       help="how Conv weight gradients are formulated: direct (default), auto (chosen by shape "
                            "for the GPU), or grouped, transposed, im2col where each applies")
    group.add_argument("--flat-state", choices=("off", "on"), default="off",
                       help="on: the update over one flat float32 buffer per optimizer state (every term one node "
                            "for all parameters: fewer GPU launches, the same numbers); off (default): per parameter")
