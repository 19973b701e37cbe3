"""``train`` and ``training_step``: the training workflows, as ``convert`` is the conversion's.

``training_step`` builds one training step (``training.build``) and writes it where asked: what
``amp-rewrite train-graph`` does. ``train`` owns a whole run: it reads and checks the data
against the step (present, of one length, shaped and typed as the model declares, labels that
fit the loss), builds the step for the first batch's extents where graph mode wants fixed ones
(falling back to a step of any batch where that build fails and graph mode was not demanded),
runs the epochs, and exports the trained model, checked against the trained step's forward
before anything is written. The command line only turns flags into ``StepOptions`` and
``FitOptions`` and calls one of these.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper

from amp_rewrite.errors import UserError
from amp_rewrite.inputs.samples import read_arrays
from amp_rewrite.ir import files, io
from amp_rewrite.rewrite.report import Report
from amp_rewrite.runtime.step_session import fixed_extents
from amp_rewrite.training.options import StepOptions
from amp_rewrite.training.runner.batching import Batching
from amp_rewrite.training.runner.options import FitOptions
from amp_rewrite.training.runner.schedules import Schedule
from amp_rewrite.training.runner.trainer import Trainer, describe
from amp_rewrite.training.spec import StepSpec
from amp_rewrite.training.step import TrainingStep, build, save

Data = str | os.PathLike | Mapping[str, np.ndarray]
"""Training or evaluation data: an .npz file, a folder of NAME.npy files, or arrays by name."""


def training_step(model, options: StepOptions | None = None, output_graph: str | os.PathLike | None = None,
                  **fields: Any) -> TrainingStep:
    """The training step of ``model`` (a path, an ``onnx.ModelProto`` or an ``onnx_ir.Model``) as
    ``options`` (a :class:`StepOptions`, or its fields by keyword) describe it; written where
    ``output_graph`` is given (STEP.onnx, STEP.onnx.json, STEP.onnx.init.npz, and
    STEP.onnx.encoder.onnx for a model with string inputs: the CLI's ``train-graph -o``). Bad input
    raises :class:`UserError`, and nothing is written."""
    options = _step_options(options, fields)
    if output_graph is not None:
        io.check_output_path(_source(model), output_graph)
    step = build(model, options)
    if output_graph is not None:
        save(step, output_graph)
    return step


@dataclass
class TrainReport:
    """What a run of ``train`` did: the step's description, each epoch's record (loss, skipped
    steps, scale, seconds, evaluation), the scale after every step, the steps skipped for inf/NaN
    gradients, and the notes given before training (``TrainingStep.notes``)."""

    spec: StepSpec
    epochs: list[dict]
    scales: list[float]
    skipped_steps: list[int]
    steps: int
    best_epoch: int | None
    lr: float
    schedule: Schedule
    notes: list[str] = field(default_factory=list)
    mixed: Report | None = None
    """The report of the trained model's mixed-precision rewrite, where one was written."""

    def to_json(self) -> str:
        return json.dumps({"spec": asdict(self.spec), "epochs": self.epochs, "scales": self.scales,
                           "skipped_steps": self.skipped_steps, "steps": self.steps, "best_epoch": self.best_epoch,
                           "lr": self.lr, "schedule": asdict(self.schedule), "notes": self.notes}, indent=1)

    def summary(self) -> str:
        lines = [f"trained {len(self.epochs)} epochs, {self.steps} steps, {len(self.skipped_steps)} skipped; last "
                 f"{describe(self.epochs[-1])}"]
        if self.best_epoch is not None:
            lines.append(f"  kept the weights of epoch {self.best_epoch}, the lowest evaluation loss")
        return "\n".join(lines)


def train(model, data: Data, options: StepOptions | None = None, fit: FitOptions | None = None,
          eval_data: Data | None = None, output: str | os.PathLike | None = None,
          mixed_output: str | os.PathLike | None = None,
          notes: Callable[[str], None] | None = None) -> tuple[Any, TrainReport]:
    """Train ``model`` on ``data`` in mixed precision with loss scaling.

    ``model`` is a path, an ``onnx.ModelProto`` or an ``onnx_ir.Model``; ``data`` (and
    ``eval_data``, evaluated after every epoch) an .npz file, a folder of NAME.npy files (read
    memory-mapped, batch by batch) or arrays keyed by the model's input names and the labels
    name. ``options`` say what the step is, ``fit`` how it runs. Returns ``(trained, report)``:
    the input model, graph unchanged, with the trained weights (written to ``output`` and that
    path returned, where given), and a :class:`TrainReport`. ``mixed_output``: also write the
    trained model's mixed-precision rewrite there. ``notes``: called with each of the step's
    notes (``TrainingStep.notes``) as soon as the step is built, before the epochs run. Bad input
    raises :class:`UserError`, and nothing is written."""
    options = options or StepOptions()
    fit = fit or FitOptions()
    for path in (output, mixed_output):
        if path is not None:
            io.check_output_path(_source(model), path)
    if mixed_output is not None and output is None:
        raise UserError("mixed_output is written beside output: give output too")
    if fit.keep_best and eval_data is None:
        raise UserError("--keep-best keeps the epoch with the lowest evaluation loss: give --eval")
    arrays, origin = _arrays(data, "the training data")
    evaluation = _arrays(eval_data, "the evaluation data") if eval_data is not None else None
    step = _built(model, options, fit, _first_batch(arrays, fit.batching, fit.batch_size))
    said = step.notes
    if notes is not None:
        for note in said:
            notes(note)
    arrays = checked(step, arrays, origin, fit.batching)
    updates = fit.epochs * math.ceil(fit.batching.count(arrays, step.spec.given) / fit.batch_size) // options.accumulate
    schedule = fit.scheduled(updates)
    evaluated = checked(step, *evaluation, fit.batching) if evaluation is not None else None
    lr = fit.rate(options)
    trainer = Trainer(step, provider=fit.provider, lr=lr, weight_decay=fit.weight_decay,
                      provider_options=fit.provider_options, batching=fit.batching, graph_mode=fit.graphs)
    first = trainer.resume(fit.resume) + 1 if fit.resume is not None else 1
    if first > fit.epochs:
        raise UserError(f"{fit.resume} ends epoch {first - 1}: nothing is left of --epochs {fit.epochs}")
    history = trainer.fit(arrays, fit.epochs, fit.batch_size, evaluated, seed=fit.seed, progress=fit.progress,
                          schedule=schedule, first_epoch=first, checkpoints=fit.checkpoints, keep_best=fit.keep_best)
    trained = trainer.exported(check_on=arrays)
    mixed = None
    if mixed_output is not None:
        mixed_model, mixed = trainer.mixed()
    report = TrainReport(step.spec, history.epochs, history.scales, history.skipped_steps, trainer.steps,
                         history.best_epoch, lr, schedule, said, mixed)
    if output is None:
        return _same_kind(model, trained), report
    with files.together() as written:  # the trained model and its rewrite: both, or neither
        written.model(trained, output)
        if mixed_output is not None:
            written.model(mixed_model, mixed_output)
    return output, report


def checked(step: TrainingStep, data: Mapping[str, np.ndarray], origin: str,
            batching: Batching) -> dict[str, np.ndarray]:
    """The arrays the step reads (its string inputs' as the model reads them), cast to its input
    types: present, of one length along their sample axes, shaped as the model declares (but for
    the sample axis), and labels that fit the loss."""
    spec = step.spec
    batching.count(data, spec.given, origin)
    result = {}
    for name in spec.given:
        declared_type = step.declared(name)
        declared = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None  # 0: dynamic
                    for d in declared_type.shape.dim]
        shape = data[name].shape
        sample = None if batching.whole(name, data[name]) else batching.axis(name) % len(shape)
        if len(shape) != len(declared) or any(d is not None and d != s for axis, (d, s) in enumerate(
                zip(declared, shape)) if axis != sample):
            expected = [d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in declared_type.shape.dim]
            raise UserError(f"{origin}: array {name!r} has shape {list(shape)}; the model expects {expected}")
        result[name] = data[name].astype(helper.tensor_dtype_to_np_dtype(declared_type.elem_type), copy=False)
    labels = result.get(spec.labels) if spec.labels else None
    if labels is not None and labels.dtype.kind in "iu":
        classes = step.classes
        if classes is not None and labels.size and (labels.min() < 0 or labels.max() >= classes):
            raise UserError(f"{origin}: labels must be class indices in [0, {classes}); {spec.labels!r} holds "
                            f"{labels.min()}..{labels.max()}")
    return result


def _step_options(options: StepOptions | None, fields: Mapping[str, Any]) -> StepOptions:
    if options is not None and fields:
        raise UserError("pass either options= or option keywords, not both")
    try:
        return options or StepOptions(**fields)
    except TypeError as exc:
        raise UserError(str(exc)) from None


def _source(model) -> str | os.PathLike | None:
    return model if isinstance(model, (str, os.PathLike)) else None


def _arrays(data: Data, said: str) -> tuple[dict[str, np.ndarray], str]:
    """The arrays of ``data``, and how errors name them (the file, or ``said``)."""
    if isinstance(data, (str, os.PathLike)):
        return read_arrays(data), os.fspath(data)
    if not isinstance(data, Mapping) or not all(isinstance(k, str) for k in data):
        raise UserError(f"{said} must be an .npz path, a folder of .npy files or a dict of arrays by name")
    return {name: np.asarray(array) for name, array in data.items()}, said


def _built(model, options: StepOptions, fit: FitOptions, first: dict[str, np.ndarray]) -> TrainingStep:
    """The step, built for the extents of the first batch where graph mode wants fixed ones (``on``,
    or ``auto`` on CUDA; ``auto`` falls back to a step of any batch where that build fails)."""
    if not fixed_extents(fit.graphs, fit.provider):
        return build(model, options, [first])
    try:
        return build(model, options, [first], {name: np.shape(array) for name, array in first.items()})
    except UserError:
        if fit.graph_mode == "on":
            raise
        return build(model, options, [first])


def _first_batch(data: dict[str, np.ndarray], batching: Batching, size: int) -> dict[str, np.ndarray]:
    """The first ``size`` samples of the arrays that hold samples where ``batching`` says, and
    the whole ones: what the step's range check runs on first."""
    usable = [n for n, a in data.items() if batching.whole(n, a) or -np.ndim(a) <= batching.axis(n) < np.ndim(a)]
    return batching.take(data, usable, slice(0, size))


def _same_kind(model, trained: onnx.ModelProto):
    """``trained`` as the kind of model given: an ``onnx_ir.Model`` for one, else the proto."""
    if type(model).__module__.startswith("onnx_ir"):
        import onnx_ir as ir

        return ir.serde.deserialize_model(trained)
    return trained
