"""``amp-rewrite train``: train a model on .npz data in mixed precision; write the trained model."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
from onnx import helper

from amp_rewrite.cli.common import EXIT_OK, check_writable, coloring_arguments, training_arguments
from amp_rewrite.cli.train_graph import build_step
from amp_rewrite.errors import UserError
from amp_rewrite.inputs.samples import read_arrays
from amp_rewrite.ir import io
from amp_rewrite.training.batching import Batching
from amp_rewrite.training.graph_mode import MODES, fixed_extents
from amp_rewrite.training.modes import RUNNING_ROLES, untrained
from amp_rewrite.training.optimizers import DEFAULT_LR
from amp_rewrite.training.schedules import KINDS, Schedule


def add_parser(commands) -> None:
    parser = commands.add_parser("train", help="train a model on .npz data with mixed precision and loss scaling")
    parser.add_argument("input", help="the ONNX model (float16, bfloat16 or float64 ones train as float32)")
    parser.add_argument("--data", required=True, metavar="TRAIN.npz|DIR",
                        help="arrays keyed by the model's input names and the labels name; axis 0 is the sample "
                             "(see --batch-axis, --fixed). "
                             "A folder of NAME.npy files is opened memory-mapped and read batch by batch")
    parser.add_argument("--eval", metavar="TEST.npz|DIR", help="evaluated after every epoch")
    parser.add_argument("-o", "--trained", required=True, metavar="TRAINED.onnx",
                        help="the input model, graph unchanged, with the trained float32 weights")
    parser.add_argument("--mixed-output", metavar="TRAINED.mixed.onnx", help="also write its mixed-precision rewrite")
    parser.add_argument("--report", metavar="REPORT.json", help="per-epoch loss and evaluation, scales, skipped steps")
    defaults = ", ".join(f"{rate:g} for {name}" for name, rate in DEFAULT_LR.items())
    parser.add_argument("--lr", type=float, help=f"base learning rate (default: {defaults}: a rate that fine-tunes "
                                                 f"a pretrained model without wrecking it)")
    parser.add_argument("--schedule", choices=KINDS, default="constant",
                        help="learning-rate schedule over the steps: constant, cosine (to 0 at the last step) or step")
    parser.add_argument("--warmup-steps", type=int, default=0, help="updates of linear warm-up first")
    parser.add_argument("--step-size", type=int, default=0, help="step schedule: updates between two decays")
    parser.add_argument("--gamma", type=float, default=0.1, help="step schedule: the decay factor")
    parser.add_argument("--batch-axis", dest="batch_axes", action="append", default=[], metavar="NAME:AXIS",
                        help="the sample axis of an input or the labels, where it is not 0 (a recurrent state "
                             "[layers, batch, hidden]: state:1); repeatable")
    parser.add_argument("--fixed", action="append", default=[], metavar="NAME",
                        help="an input fed whole at every step (0-d arrays are); repeatable")
    parser.add_argument("--checkpoint-dir", metavar="DIR", help="write DIR/epoch-N.npz after every epoch")
    parser.add_argument("--resume", metavar="CHECKPOINT.npz",
                        help="start from a checkpoint (weights, optimizer and scaler state) at the epoch after it")
    parser.add_argument("--keep-best", action="store_true",
                        help="with --eval: export the weights of the epoch with the lowest evaluation loss")
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0, help="seed of the shuffling")
    parser.add_argument("--train-provider", dest="train_provider", default="CPUExecutionProvider",
                        help="ONNX Runtime execution provider that runs the steps (default CPUExecutionProvider)")
    parser.add_argument("--provider-option", dest="provider_options", action="append", default=[],
                        metavar="KEY=VALUE", help="an option of that provider, in ONNX Runtime's names (repeatable): "
                                                  "device_id=1, gpu_mem_limit=8000000000")
    parser.add_argument("--graph-mode", choices=MODES, default="auto",
                        help="build the step for batches of --batch-size (a last, partial batch is left out), bind "
                             "its inputs and outputs at fixed addresses and, on CUDAExecutionProvider, run it as "
                             "CUDA graphs: auto (default: on CUDA), on, off")
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
    if args.keep_best and not args.eval:
        raise UserError("--keep-best keeps the epoch with the lowest evaluation loss: give --eval")
    provider_options = _key_values(args.provider_options, "--provider-option")
    train = read_arrays(args.data)
    evaluation = read_arrays(args.eval) if args.eval else None
    Schedule(args.schedule, args.warmup_steps, 0, args.step_size, args.gamma)  # its errors before the build
    batching = Batching.parse(args.batch_axes, args.fixed)
    step = _built(args, _first_batch(train, batching, args.batch_size))
    if untrained([(c.role, step.initial[c.input]) for c in step.spec.carried if c.role in RUNNING_ROLES]):
        print("amp-rewrite: warning: the BatchNormalization running statistics were never measured on data "
              "(they hold their initial values, means 0 and variances 1, or one value per tensor): training "
              "replaces them with the data's, which moves the model's inference outputs; --batchnorm freeze keeps "
              "them", file=sys.stderr)
    if step.spec.held and not args.quiet:
        print(f"amp-rewrite: training {len(step.spec.params)} parameters; {len(step.spec.held)} tensors the loss "
              f"reads stay as they are (a frozen BatchNormalization's running statistics, formulas' epsilons and "
              f"scales); --param NAME trains one", file=sys.stderr)
    train = _checked(step, train, args.data, batching)
    updates = args.epochs * math.ceil(batching.count(train, step.spec.given) / args.batch_size) // args.accumulate
    schedule = Schedule(args.schedule, args.warmup_steps, updates, args.step_size, args.gamma)
    evaluation = _checked(step, evaluation, args.eval, batching) if evaluation is not None else None
    lr = args.lr if args.lr is not None else DEFAULT_LR[args.optimizer]
    trainer = Trainer(step, provider=args.train_provider, lr=lr, weight_decay=args.weight_decay,
                      provider_options=provider_options, batching=batching, graph_mode=MODES[args.graph_mode])
    first = trainer.resume(args.resume) + 1 if args.resume else 1
    if first > args.epochs:
        raise UserError(f"{args.resume} ends epoch {first - 1}: nothing is left of --epochs {args.epochs}")
    history = trainer.fit(train, args.epochs, args.batch_size, evaluation, seed=args.seed, progress=not args.quiet,
                          schedule=schedule, first_epoch=first, checkpoints=args.checkpoint_dir,
                          keep_best=args.keep_best)
    trainer.export(args.trained, check_on=train)
    if args.mixed_output:
        trainer.export_mixed(args.mixed_output)
    if args.report:
        report = {"spec": json.loads(step.spec.to_json()), "epochs": history.epochs, "scales": history.scales,
                  "skipped_steps": history.skipped_steps, "steps": trainer.steps, "best_epoch": history.best_epoch,
                  "lr": lr, "schedule": asdict(schedule)}
        io.save_text(Path(args.report), json.dumps(report, indent=1))
    if not args.quiet:
        print(f"amp-rewrite: trained {args.epochs} epochs, {trainer.steps} steps, {len(history.skipped_steps)} "
              f"skipped; last {describe(history.epochs[-1])}")
        if history.best_epoch is not None:
            print(f"  kept the weights of epoch {history.best_epoch}, the lowest evaluation loss")
        print(f"  wrote {args.trained}" + (f" and {args.mixed_output}" if args.mixed_output else ""))
    return EXIT_OK


def _checked(step, data: dict[str, np.ndarray], origin: str, batching: Batching) -> dict[str, np.ndarray]:
    """The arrays the step reads (its string inputs' as the model reads them), cast to its input
    types: present, of one length along their sample axes, shaped as the model declares (but for
    the sample axis), and labels that fit the loss."""
    spec = step.spec
    batching.count(data, spec.given, origin)
    inputs = {i.name: i.type.tensor_type for i in (*step.original.graph.input, *step.model.graph.input)}
    result = {}
    for name in spec.given:
        declared = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None  # 0: dynamic
                    for d in inputs[name].shape.dim]
        shape = data[name].shape
        sample = None if batching.whole(name, data[name]) else batching.axis(name) % len(shape)
        if len(shape) != len(declared) or any(d is not None and d != s for axis, (d, s) in enumerate(
                zip(declared, shape)) if axis != sample):
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


def _built(args: argparse.Namespace, first: dict[str, np.ndarray]):
    """The step, built for the extents of the first batch where graph mode wants fixed ones (``on``,
    or ``auto`` on CUDA; ``auto`` falls back to a step of any batch where that build fails)."""
    if not fixed_extents(MODES[args.graph_mode], args.train_provider):
        return build_step(args, [first])
    try:
        return build_step(args, [first], {name: np.shape(array) for name, array in first.items()})
    except UserError:
        if args.graph_mode == "on":
            raise
        return build_step(args, [first])


def _first_batch(data: dict[str, np.ndarray], batching: Batching, size: int) -> dict[str, np.ndarray]:
    """The first ``size`` samples of the arrays that hold samples where ``batching`` says, and
    the whole ones: what the step's range check runs on first."""
    usable = [n for n, a in data.items() if batching.whole(n, a) or -np.ndim(a) <= batching.axis(n) < np.ndim(a)]
    return batching.take(data, usable, slice(0, size))


def _key_values(items: list[str], flag: str) -> dict[str, str]:
    pairs = [item.partition("=") for item in items]
    bad = [item for item, (key, eq, _) in zip(items, pairs) if not key or not eq]
    if bad:
        raise UserError(f"{flag} takes KEY=VALUE, got {bad[0]!r}")
    return {key: value for key, _, value in pairs}
