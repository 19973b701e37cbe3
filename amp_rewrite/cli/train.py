"""``amp-rewrite train``: train a model on .npz data in mixed precision; write the trained model."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from onnx import helper

from amp_rewrite.cli.common import EXIT_OK, check_writable, coloring_arguments, training_arguments
from amp_rewrite.cli.train_graph import build_step
from amp_rewrite.errors import UserError
from amp_rewrite.ir import io
from amp_rewrite.runtime.samples import read_npz


def add_parser(commands) -> None:
    parser = commands.add_parser("train", help="train a model on .npz data with mixed precision and loss scaling")
    parser.add_argument("input", help="the float32 ONNX model")
    parser.add_argument("--data", required=True, metavar="TRAIN.npz",
                        help="arrays keyed by the model's input names and the labels name; axis 0 is the sample")
    parser.add_argument("--eval", metavar="TEST.npz", help="evaluated after every epoch")
    parser.add_argument("-o", "--trained", required=True, metavar="TRAINED.onnx",
                        help="the input model, graph unchanged, with the trained float32 weights")
    parser.add_argument("--mixed-output", metavar="TRAINED.mixed.onnx", help="also write its mixed-precision rewrite")
    parser.add_argument("--report", metavar="REPORT.json", help="per-epoch loss and evaluation, scales, skipped steps")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0, help="seed of the shuffling")
    parser.add_argument("--train-provider", dest="train_provider", default="CPUExecutionProvider",
                        help="ONNX Runtime execution provider that runs the steps (default CPUExecutionProvider)")
    parser.add_argument("--provider-option", dest="provider_options", action="append", default=[],
                        metavar="KEY=VALUE", help="an option of that provider, in ONNX Runtime's names (repeatable): "
                                                  "device_id=1, gpu_mem_limit=8000000000")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    training_arguments(parser)
    coloring_arguments(parser, float32=True)


def run(args: argparse.Namespace) -> int:
    from amp_rewrite.training.trainer import Trainer, describe  # the training layers: only for this command

    for path in (args.trained, args.mixed_output):
        if path:
            io.check_output_path(args.input, path)
    if args.report:
        check_writable(Path(args.report))
    if args.epochs < 1 or args.batch_size < 1:
        raise UserError("--epochs and --batch-size must be at least 1")
    provider_options = _key_values(args.provider_options, "--provider-option")
    train = read_npz(args.data)
    evaluation = read_npz(args.eval) if args.eval else None
    step = build_step(args, [{name: array[:args.batch_size] for name, array in train.items() if np.ndim(array)}])
    train = _checked(step, train, args.data)
    evaluation = _checked(step, evaluation, args.eval) if evaluation is not None else None
    trainer = Trainer(step, provider=args.train_provider, lr=args.lr, weight_decay=args.weight_decay,
                      provider_options=provider_options)
    history = trainer.fit(train, args.epochs, args.batch_size, evaluation, seed=args.seed, progress=not args.quiet)
    trainer.export(args.trained)
    if args.mixed_output:
        trainer.export_mixed(args.mixed_output)
    if args.report:
        report = {"spec": json.loads(step.spec.to_json()), "epochs": history.epochs, "scales": history.scales,
                  "skipped_steps": history.skipped_steps, "steps": trainer.steps}
        io.save_text(Path(args.report), json.dumps(report, indent=1))
    if not args.quiet:
        print(f"amp-rewrite: trained {args.epochs} epochs, {trainer.steps} steps, {len(history.skipped_steps)} "
              f"skipped; last {describe(history.epochs[-1])}")
        print(f"  wrote {args.trained}" + (f" and {args.mixed_output}" if args.mixed_output else ""))
    return EXIT_OK


def _checked(step, data: dict[str, np.ndarray], origin: str) -> dict[str, np.ndarray]:
    """The arrays the step reads, cast to its input types: present, of one length, shaped as the
    model declares, and labels that fit the loss."""
    from amp_rewrite.training.trainer import sample_count

    spec = step.spec
    sample_count(data, spec.data, origin)
    inputs = {i.name: i.type.tensor_type for i in step.model.graph.input}
    result = {}
    for name in spec.data:
        declared = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None  # 0: dynamic
                    for d in inputs[name].shape.dim]
        shape = data[name].shape
        if len(shape) != len(declared) or any(d is not None and d != s for d, s in zip(declared[1:], shape[1:])):
            expected = [d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in inputs[name].shape.dim]
            raise UserError(f"{origin}: array {name!r} has shape {list(shape)}; the model expects {expected}")
        result[name] = data[name].astype(helper.tensor_dtype_to_np_dtype(inputs[name].elem_type), copy=False)
    labels = result.get(spec.labels) if spec.labels else None
    if labels is not None and labels.dtype.kind in "iu":
        classes = _classes(step)
        if classes is not None and labels.size and (labels.min() < 0 or labels.max() >= classes):
            raise UserError(f"{origin}: labels must be class indices in [0, {classes}); {spec.labels!r} holds "
                            f"{labels.min()}..{labels.max()}")
    return result


def _classes(step) -> int | None:
    output = next((o for o in step.forward.graph.output if o.name == step.spec.outputs[0]), None)
    dims = output.type.tensor_type.shape.dim if output is not None else []
    return dims[1].dim_value if len(dims) > 1 and dims[1].HasField("dim_value") else None


def _key_values(items: list[str], flag: str) -> dict[str, str]:
    pairs = [item.partition("=") for item in items]
    bad = [item for item, (key, eq, _) in zip(items, pairs) if not key or not eq]
    if bad:
        raise UserError(f"{flag} takes KEY=VALUE, got {bad[0]!r}")
    return {key: value for key, _, value in pairs}
