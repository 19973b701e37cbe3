"""``amp-rewrite train-graph``: write the training step graph and its description, to drive elsewhere."""

from __future__ import annotations

import argparse
import sys

from amp_rewrite.cli.common import EXIT_OK, coloring_arguments, step_options, training_arguments
from amp_rewrite.errors import printable


def add_parser(commands) -> None:
    parser = commands.add_parser("train-graph", help="write one training step as an ONNX graph (+ .json, .init.npz)")
    parser.add_argument("input", help="the ONNX model (float16, bfloat16 or float64 ones train as float32)")
    parser.add_argument("-o", "--output-graph", dest="target", required=True, metavar="STEP.onnx",
                        help="where to write the step graph; STEP.onnx.json and STEP.onnx.init.npz go beside it")
    parser.add_argument("--quiet", action="store_true", help="print nothing on success")
    training_arguments(parser)
    coloring_arguments(parser, float32=True)


def run(args: argparse.Namespace) -> int:
    from amp_rewrite.workflows.train import training_step  # the training layers: only for this command

    step = training_step(args.input, step_options(args), output_graph=args.target)
    for note in step.notes:
        if note.startswith("warning:"):
            print(f"amp-rewrite: {printable(note)}", file=sys.stderr)
    if not args.quiet:
        spec = step.spec
        print(f"amp-rewrite: training step ({spec.precision}, {spec.optimizer}, loss scale "
              f"{spec.loss_scale['mode']}): {len(spec.params)} parameters"
              + (f" ({len(spec.held)} tensors the loss reads held as they are)" if spec.held else "")
              + f", {len(step.model.graph.node)} nodes")
        print(printable(f"  inputs: data {', '.join(spec.data)}; hyper-parameters {spec.lr}, {spec.weight_decay}"))
        print(f"  wrote {args.target}, {args.target}.json, {args.target}.init.npz")
    return EXIT_OK
