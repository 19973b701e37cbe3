"""``amp-rewrite train``: train a model on .npz data in mixed precision; write the trained model."""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

from amp_rewrite.cli.common import EXIT_OK, check_writable, coloring_arguments, step_options, training_arguments
from amp_rewrite.errors import UserError, printable
from amp_rewrite.ir import files
from amp_rewrite.training.graph.optimizers import DEFAULT_LR
from amp_rewrite.training.runner.batching import Batching
from amp_rewrite.training.runner.options import GRAPH_MODES, FitOptions
from amp_rewrite.training.runner.schedules import KINDS, Schedule


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
    parser.add_argument("--graph-mode", choices=GRAPH_MODES, default="auto",
                        help="build the step for batches of --batch-size (a last, partial batch is left out), bind "
                             "its inputs and outputs at fixed addresses and, on CUDAExecutionProvider, run it as "
                             "CUDA graphs: auto (default: on CUDA), on, off")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    training_arguments(parser)
    coloring_arguments(parser, float32=True)


def run(args: argparse.Namespace) -> int:
    from amp_rewrite.workflows.train import train  # the training layers: only for this command

    if args.report:
        check_writable(Path(args.report))
    fit = FitOptions(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, weight_decay=args.weight_decay,
                     schedule=Schedule(args.schedule, args.warmup_steps, 0, args.step_size, args.gamma),
                     batching=Batching.parse(args.batch_axes, args.fixed), seed=args.seed,
                     provider=args.train_provider, provider_options=_key_values(args.provider_options,
                                                                                 "--provider-option"),
                     graph_mode=args.graph_mode, checkpoints=args.checkpoint_dir, resume=args.resume,
                     keep_best=args.keep_best, progress=not args.quiet)
    _, report = train(args.input, args.data, step_options(args), fit, eval_data=args.eval, output=args.trained,
                      mixed_output=args.mixed_output, notes=functools.partial(_note, args.quiet))
    if args.report:
        files.save_text(Path(args.report), report.to_json())
    if not args.quiet:
        print(f"amp-rewrite: {report.summary()}")
        print(f"  wrote {args.trained}" + (f" and {args.mixed_output}" if args.mixed_output else ""))
    return EXIT_OK


def _note(quiet: bool, note: str) -> None:
    """A note of the step on stderr: a warning always, the rest unless ``quiet``."""
    if note.startswith("warning:") or not quiet:
        print(f"amp-rewrite: {printable(note)}", file=sys.stderr)


def _key_values(items: list[str], flag: str) -> dict[str, str]:
    pairs = [item.partition("=") for item in items]
    bad = [item for item, (key, eq, _) in zip(items, pairs) if not key or not eq]
    if bad:
        raise UserError(f"{flag} takes KEY=VALUE, got {bad[0]!r}")
    return {key: value for key, _, value in pairs}
