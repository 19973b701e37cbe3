"""``amp-rewrite train-graph``: write the training step graph and its description, to drive elsewhere."""

from __future__ import annotations

import argparse
import sys

from amp_rewrite.cli.common import EXIT_OK, coloring_arguments, convert_options, training_arguments
from amp_rewrite.errors import printable
from amp_rewrite.ir import io


def add_parser(commands) -> None:
    parser = commands.add_parser("train-graph", help="write one training step as an ONNX graph (+ .json, .init.npz)")
    parser.add_argument("input", help="the ONNX model (float16, bfloat16 or float64 ones train as float32)")
    parser.add_argument("-o", "--output-graph", dest="target", required=True, metavar="STEP.onnx",
                        help="where to write the step graph; STEP.onnx.json and STEP.onnx.init.npz go beside it")
    parser.add_argument("--quiet", action="store_true", help="print nothing on success")
    training_arguments(parser)
    coloring_arguments(parser, float32=True)


def build_step(args: argparse.Namespace, range_data=(), specialize=None):
    """The training step the flags describe (shared with ``train``, whose training data its
    range check runs on: ``range_data``, and which fixes its extents for graph mode:
    ``specialize``); its warnings on stderr."""
    from amp_rewrite.training import build  # the training layers: only for this command

    step = build(args.input, loss=args.loss, params=args.param, optimizer_spec=args.optimizer,
                 precision=args.precision, loss_scale=args.loss_scale, options=convert_options(args),
                 output=args.output, labels=args.labels, batchnorm=args.batchnorm, range_data=range_data,
                 train=args.train_patterns, freeze=args.freeze_patterns, clip_norm=args.clip_norm,
                 accumulate=args.accumulate, specialize=specialize, conv_weight_grad=args.conv_weight_grad,
                 flat_state=args.flat_state)
    for note in step.report.notes if step.report else ():
        if note.startswith("warning:"):
            print(f"amp-rewrite: {printable(note)}", file=sys.stderr)
    return step


def run(args: argparse.Namespace) -> int:
    from amp_rewrite.training.step import save  # the training layers: only for this command

    io.check_output_path(args.input, args.target)
    step = build_step(args)
    save(step, args.target)
    if not args.quiet:
        spec = step.spec
        print(f"amp-rewrite: training step ({spec.precision}, {spec.optimizer}, loss scale "
              f"{spec.loss_scale['mode']}): {len(spec.params)} parameters"
              + (f" ({len(spec.held)} tensors the loss reads held as they are)" if spec.held else "")
              + f", {len(step.model.graph.node)} nodes")
        print(printable(f"  inputs: data {', '.join(spec.data)}; hyper-parameters {spec.lr}, {spec.weight_decay}"))
        print(f"  wrote {args.target}, {args.target}.json, {args.target}.init.npz")
    return EXIT_OK
