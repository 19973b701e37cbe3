"""``amp-rewrite grad``: write the model with the gradient of its loss for each parameter as outputs."""

from __future__ import annotations

import argparse

from amp_rewrite.cli.common import EXIT_OK
from amp_rewrite.ir import io


def add_parser(commands) -> None:
    grad = commands.add_parser("grad", help="add the gradient of a scalar loss output for each weight as outputs")
    grad.add_argument("input", help="the ONNX model (float32 or the mixed-precision output of convert)")
    grad.add_argument("--loss", required=True, metavar="NAME", help="the scalar float output to differentiate")
    grad.add_argument("--wrt", action="append", metavar="NAME",
                      help="an initializer (or float input) to differentiate with respect to; repeat for more "
                           "(default: every float initializer the loss depends on)")
    grad.add_argument("-o", "--output", required=True, help="where to write the model with NAME_grad outputs")
    grad.add_argument("--quiet", action="store_true", help="print nothing on success")


def run(args: argparse.Namespace) -> int:
    from amp_rewrite.autodiff.gradient import differentiable, gradient_proto  # autodiff: only for this command

    io.check_output_path(args.input, args.output)
    proto, base_dir, _ = io.read_model(args.input)
    proto = differentiable(proto)  # the forward counted as it is differentiated: its functions inlined
    nodes, outputs = len(proto.graph.node), len(proto.graph.output)
    result = gradient_proto(proto, args.loss, args.wrt)
    io.save(result, args.output, base_dir)
    if not args.quiet:
        added = len(result.graph.output) - outputs
        print(f"amp-rewrite: {added} gradient{'s' if added != 1 else ''} of {args.loss!r}; {nodes} forward "
              f"nodes, {len(result.graph.node) - nodes} backward nodes")
        print(f"  wrote {args.output}")
    return EXIT_OK
