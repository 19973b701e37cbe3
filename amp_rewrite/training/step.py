"""``build``: one training step as one ONNX graph, and the description a driver needs.

The step graph reads the data (the model's inputs and the labels), the float32 master
weights, the optimizer state, the loss-scale state and the hyper-parameters (learning
rate, weight decay), and returns the loss, the model's outputs, the next weights and
states, and whether the step was skipped. Its forward is the mixed-precision rewrite
of the model with the weights as float32 inputs (cast to low precision where low
precision ops read them, so their gradients arrive in float32); the loss, the
unscaled gradients, the update and the scale stay float32. A step whose gradients hold
an inf or NaN changes no weight, state or step count (``Where`` selects the old
values) and backs the scale off.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from amp_rewrite.autodiff.context import DynamicShapes, NoParameters
from amp_rewrite.autodiff.gradient import default_parameters, differentiable
from amp_rewrite.autodiff.lowerings.recurrent import unrolled
from amp_rewrite.errors import RangeCheckFailed, UserError
from amp_rewrite.inputs import samples
from amp_rewrite.ir import files, io
from amp_rewrite.ir.builder import FLOAT_TYPES
from amp_rewrite.ir.precision import Precision
from amp_rewrite.ir.specialize import specialized
from amp_rewrite.ir.tensors import initializer_to_input, read_array
from amp_rewrite.rewrite.measuring import Ranges
from amp_rewrite.rewrite.options import ConvertOptions
from amp_rewrite.rewrite.passes import MeasureRanges
from amp_rewrite.rewrite.pipeline import prepare, rewrite
from amp_rewrite.rewrite.report import Report, build_report
from amp_rewrite.runtime import instrument, ranges
from amp_rewrite.runtime.expose import expose
from amp_rewrite.runtime.isolate import isolated
from amp_rewrite.training import adapters
from amp_rewrite.training.adapters import constant_weights, encoders, float32_view
from amp_rewrite.training.graph.assembly import LR, WEIGHT_DECAY, assemble
from amp_rewrite.training.graph.coefficients import coefficients
from amp_rewrite.training.graph.losses import LOSSES, attach_loss
from amp_rewrite.training.graph.modes import (
    RUNNING_ROLES,
    batchnorm_mode,
    batchnorm_to_train_mode,
    dropout_to_train_mode,
    frozen_statistics,
    untrained,
)
from amp_rewrite.training.options import StepOptions
from amp_rewrite.training.preflight.gradient_stops import why_no_weights
from amp_rewrite.training.preflight.resolution import check_resolved, logits
from amp_rewrite.training.spec import StepSpec

FLOAT = TensorProto.FLOAT


@dataclass
class TrainingStep:
    model: onnx.ModelProto
    spec: StepSpec
    initial: dict[str, np.ndarray]
    """The first values of every carried input."""
    original: onnx.ModelProto
    """The input of ``build``, as given: what ``Trainer.exported`` holds the trained weights in."""
    forward: onnx.ModelProto
    """The float32 model with the loss attached (what ``Trainer.evaluate`` runs)."""
    report: Report | None = None
    """The mixed-precision rewrite's report (None for float32)."""
    options: ConvertOptions | None = None
    """The rewrite's options (None for float32): ``Trainer.mixed`` rewrites with them."""
    encoder: onnx.ModelProto | None = None
    """The model's encoders of its string inputs, run ahead of the step (``encoders.split``); None: none."""

    @property
    def classes(self) -> int | None:
        """The classes a standard loss's output scores (its axis 1, where the model declares it)."""
        output = next((o for o in self.forward.graph.output if o.name == self.spec.outputs[0]), None)
        dims = output.type.tensor_type.shape.dim if output is not None else []
        return dims[1].dim_value if len(dims) > 1 and dims[1].HasField("dim_value") else None

    def declared(self, name: str) -> onnx.TypeProto.Tensor:
        """The declared type of an array the user's data holds (``StepSpec.given``): a string input
        as the model declares it, the rest as the step does."""
        inputs = {i.name: i.type.tensor_type for i in (*self.original.graph.input, *self.model.graph.input)}
        return inputs[name]

    @property
    def notes(self) -> list[str]:
        """What the caller should know before training: the rewrite's warnings, running statistics
        that were never measured on data (training replaces them), tensors the loss reads left as
        they are. Warnings begin "warning:"."""
        said = [note for note in (self.report.notes if self.report else ()) if note.startswith("warning:")]
        running = [(c.role, self.initial[c.input]) for c in self.spec.carried if c.role in RUNNING_ROLES]
        if untrained(running):
            said.append("warning: the BatchNormalization running statistics were never measured on data (they hold "
                        "their initial values, means 0 and variances 1, or one value per tensor): training replaces "
                        "them with the data's, which moves the model's inference outputs; --batchnorm freeze keeps "
                        "them")
        if self.spec.held:
            said.append(f"training {len(self.spec.params)} parameters; {len(self.spec.held)} tensors the loss reads "
                        f"stay as they are (a frozen BatchNormalization's running statistics, formulas' epsilons and "
                        f"scales); --param NAME trains one")
        return said


def build(model, options: StepOptions | None = None, range_data: Sequence[Mapping[str, np.ndarray]] = (),
          specialize: Mapping[str, Sequence[int]] | None = None, **fields: Any) -> TrainingStep:
    """The training step of ``model`` (a path, a ModelProto or an onnx_ir Model; of its float32
    view where its floats are another type: ``float32_view``), as ``options`` (a
    :class:`StepOptions`, or its fields by keyword) describe it. Dropout is active in the step.
    ``range_data``: samples of the data inputs and labels (the training data) for the rewrite's
    range check, which otherwise runs on generated inputs. ``specialize``: input name -> extents:
    the step is built for those (``ir.specialize``: shapes computed at run time folded to
    constants), and takes batches of them only; where a rule needs static shapes and
    ``range_data`` is given, the step is specialized to its first sample's extents by itself.
    String inputs: their encoders run ahead of the step (``encoders``), which reads what they make;
    ``range_data`` and ``specialize`` name the strings, as the user's data does."""
    if options is not None and fields:
        raise UserError("pass either options= or option keywords, not both")
    try:
        options = options or StepOptions(**fields)
    except TypeError as exc:
        raise UserError(str(exc)) from None
    try:
        return _build(model, options, range_data, specialize)
    except DynamicShapes as exc:
        if specialize is not None:
            raise
        if not range_data:
            raise DynamicShapes(f"{exc} (given training data, whose extents are fixed, train specializes the step "
                                f"to them, which makes these static)") from None
    return _build(model, options, range_data, {name: np.shape(array) for name, array in range_data[0].items()})


def _build(model, options: StepOptions, range_data: Sequence[Mapping[str, np.ndarray]],
           specialize: Mapping[str, Sequence[int]] | None) -> TrainingStep:
    """``build``'s work, for given extents or none."""
    loss, output, precision = options.loss, options.output, options.precision
    proto, base_dir, _ = io.read_model(model, "train")
    if base_dir is not None:  # training holds the weights in memory anyway
        io.embed_external(proto, base_dir)
    original = onnx.ModelProto()
    original.CopyFrom(proto)
    adapters.lower(proto)  # weights of Constant nodes and attributes as initializers, every float type float32
    # the model's own float tensors: values specialization folds (a zero recurrent state of a
    # run-time batch) are constants of the step, never parameters
    weights = {t.name for t in proto.graph.initializer if t.data_type in FLOAT_TYPES}
    encoder = encoders.split(proto, weights)  # ONNX Runtime binds no string tensor to a session's inputs
    encoding = encoders.Encoding(encoder)
    if specialize is not None:
        specialize = encoding.extents(specialize, range_data[0] if range_data else None)
    range_data = [{name: float32_view.as_float32(array) for name, array in encoding(sample).items()}
                  for sample in range_data]
    kind = loss if loss in LOSSES else None
    if kind and range_data:  # probabilities past float32's resolution train to nothing: say so first
        assert output is not None  # StepOptions refuses a standard loss without its output
        check_resolved(logits(proto, output, range_data[0]))
    forward, loss, labels_name = _with_loss(proto, loss, output, options.labels)
    if specialize is not None:  # before anything reads shapes; weights (float tensors) are never folded
        inputs = samples.graph_inputs(proto)
        seen = _observed(proto, {k: v for k, v in range_data[0].items() if k in inputs}) if range_data else None
        proto = specialized(proto, {k: v for k, v in specialize.items() if k in inputs},
                            keep={t.name for t in proto.graph.initializer if t.data_type in FLOAT_TYPES
                                  and math.prod(t.dims) >= constant_weights.MIN_ELEMENTS}, observed=seen)
        proto, _, _ = _with_loss(proto, kind or loss, output, options.labels)
    else:
        proto = onnx.ModelProto.FromString(forward.SerializeToString())
    unrolled(proto)  # recurrent layers as the ops they are made of; their length must be static
    running = batchnorm_to_train_mode(proto) if batchnorm_mode(proto, options.batchnorm) == "train" else []
    dropout_to_train_mode(proto)
    constants = frozen_statistics(proto) | coefficients(proto)  # buffers, and formulas' epsilons and scales
    try:
        reached = [name for name in default_parameters(proto, loss) if name in weights]
        found = [name for name in reached if name not in constants]
    except NoParameters:
        raise UserError(why_no_weights(proto, loss)) from None
    params = options.params
    if not found and params is None:
        raise UserError(f"the loss {loss!r} reaches only running statistics and constants of its formulas (epsilons, "
                        f"scales), which train leaves as they are; --param NAME trains one")
    names = _selected(proto, list(params) if params is not None else found, options.train, options.freeze)
    initial = _lift_parameters(proto, names)
    initial.update((stat.input, stat.value) for stat in running)
    report = None
    rewrite_options = None
    if precision != "float32":
        rewrite_options = replace(options.convert or ConvertOptions(), precision=precision)
        settings = replace(rewrite_options, keep_io_types=True, fp32_residual_stream=True)
        analysis, stats = _rewritten(proto, settings, initial, labels_name, range_data)
        report = build_report(analysis, stats)
    opt, scaling, accumulate = options.update, options.scaling, options.accumulate
    step = assemble(proto, loss, names, initial, opt, scaling, running, options.clip_norm, accumulate,
                    options.conv_weight_grad, options.flat_state)
    spec = StepSpec(data=list(samples.graph_inputs(forward)), labels=labels_name, loss=loss, skipped=step.skipped,
                    outputs=[o.name for o in forward.graph.output if o.name != loss], carried=step.carried,
                    lr=LR, weight_decay=WEIGHT_DECAY, precision=precision, optimizer=opt.name,
                    loss_scale=asdict(scaling), loss_kind=kind, loss_output=output if kind else None,
                    extents={k: list(v) for k, v in specialize.items() if k in samples.graph_inputs(forward)}
                    if specialize is not None else None, accumulate=accumulate, strings=encoding.strings,
                    encoded=encoding.encoded, flat=names if options.flat_state == "on" else [],
                    held=[name for name in reached if name in constants] if params is None else [])
    return TrainingStep(proto, spec, step.initial, original, forward, report, rewrite_options, encoder)


def _observed(model: onnx.ModelProto, sample: Mapping[str, np.ndarray]) -> dict[str, tuple] | None:
    """(shape, dtype) of every top-level tensor value on a run of ``sample`` (ONNX Runtime, in a
    child process), for the shapes onnx's inference cannot find; None where the run fails."""
    exposed = expose(model, [(0, name) for node in model.graph.node for name in node.output if name]).model
    names = [o.name for o in exposed.graph.output]

    def work(progress) -> dict[str, tuple]:
        found = instrument.run(instrument.session(exposed), sample, names)
        return {k: (v.shape, v.dtype) for k, v in found.items() if isinstance(v, np.ndarray)}

    try:
        return isolated(work, "onnxruntime (the step's shapes)")
    except Exception:  # the shapes onnx infers are all there is
        return None


def _with_loss(model: onnx.ModelProto, loss: str, output: str | None,
               labels: str) -> tuple[onnx.ModelProto, str, str | None]:
    """(a copy of ``model`` ready to differentiate, with ``loss`` attached where it is a standard
    one; the loss's name; the labels' name or None)."""
    proto = differentiable(onnx.ModelProto.FromString(model.SerializeToString()))
    if loss not in LOSSES:
        return proto, loss, None
    assert output is not None  # ``build`` refused a standard loss without the output it applies to
    attached = attach_loss(proto, loss, output, labels)
    return proto, attached.loss, attached.labels


def _rewritten(proto: onnx.ModelProto, settings: ConvertOptions, initial: dict[str, np.ndarray], labels: str | None,
               given: Sequence[Mapping[str, np.ndarray]]):
    """The forward's mixed-precision rewrite (in place), its range check measured with the real
    weights (inputs of the step now) on ``given`` samples (the training data) first, then on each
    set of generated inputs in turn (``samples.attempts``) until the model runs on one; where it
    runs on none, NOT RUN with the warning ``convert`` gives."""
    if settings.range_check == "off" or settings.calibrate:
        return measured_rewrite(proto, settings.validated())
    names = set(samples.graph_inputs(proto))
    generated = ((attempt.samples, _GENERATED)  # the weights are the step's own, never drawn
                 for attempt in samples.attempts(proto, None, settings.seed, supplied=initial))
    own: list[tuple[Sequence[Mapping[str, np.ndarray]], str]] = [(list(given), "the training data")] if given else []
    refused = None
    for data, said in itertools.chain(own, generated):
        measured = [{**{k: v for k, v in sample.items() if k in names}, **initial} for sample in data]
        if said == _GENERATED and labels is not None and measured[0][labels].dtype.kind == "i":
            measured[0][labels] = np.zeros_like(measured[0][labels])  # class 0 exists in every model
        try:
            return measured_rewrite(proto, replace(settings, calibrate=measured, range_check="off").validated())
        except RangeCheckFailed as exc:  # the model did not run on these (or they do not fit it): the next set may do
            refused = refused or exc.on(said)
    analysis, stats = measured_rewrite(proto, replace(settings, range_check="off").validated())
    analysis.range_check = f"NOT RUN: {refused}"
    analysis.notes.append(f"warning: NO RANGE WAS MEASURED: {refused}; the training step's values were not checked "
                          f"for overflow in {Precision(settings.validated().precision).value}")
    return analysis, stats


def measured_rewrite(proto: onnx.ModelProto, options: ConvertOptions):
    """``rewrite`` with ``options`` (validated), its range check measured by ONNX Runtime: every
    value beside the analysis, where the range check runs (``measuring.Ranges``)."""
    seconds: dict[str, float] = {}
    _, prepared = prepare(proto, options, seconds)
    meter = ranges.Meter.of(options.measurement, None)
    with meter.beside(proto, not MeasureRanges(options.measurement).skip_reason(proto)) as every:
        found = Ranges(table=every.result if every else None, measure=meter.measure)
        return rewrite(proto, options, None, ranges=found, prepared=prepared, seconds=seconds)


_GENERATED = "generated inputs"


def _selected(proto: onnx.ModelProto, names: list[str], train: Sequence[str], freeze: Sequence[str]) -> list[str]:
    """``names`` less those the ``train`` and ``freeze`` patterns leave out (``build``)."""
    if not train and not freeze:
        return names
    try:
        trains, freezes = ([re.compile(p) for p in patterns] for patterns in (train, freeze))
    except re.error as exc:
        raise UserError(f"--train/--freeze: not a regular expression ({exc})") from None
    readers: dict[str, list[str]] = {}
    for node in proto.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node.name)
    kept = []
    for name in names:
        said = [name, *readers.get(name, [])]
        if (not trains or any(p.search(s) for p in trains for s in said)) and \
                not any(p.search(s) for p in freezes for s in said):
            kept.append(name)
    if not kept:
        raise UserError(f"--train/--freeze leave none of the {len(names)} parameters to train")
    return kept


def _lift_parameters(proto: onnx.ModelProto, names: list[str]) -> dict[str, np.ndarray]:
    """Turn the parameters into float32 graph inputs; return their values."""
    graph = proto.graph
    tensors = {t.name: t for t in graph.initializer}
    values = {}
    for name in names:
        tensor = tensors.get(name)
        if tensor is None:
            raise UserError(f"parameter {name!r} is not an initializer of the model")
        if tensor.data_type not in FLOAT_TYPES:
            raise UserError(f"parameter {name!r} is not a float tensor")
        values[name] = read_array(tensor, None).astype(np.float32)
        initializer_to_input(graph, tensor, FLOAT)
    return values


def save(step: TrainingStep, path: str | os.PathLike) -> None:
    """Write the step graph, its description (``.json``), its first values (``.init.npz``) and
    the encoder of the string inputs where the model has one (``.encoder.onnx``: ``StepSpec.strings``
    in, ``StepSpec.encoded`` out): all of them, or none where one cannot be written."""
    stem = os.fspath(path)
    with files.together() as written:
        written.arrays(Path(stem + ".init.npz"), step.initial)
        written.text(Path(stem + ".json"), step.spec.to_json())
        if step.encoder is not None:
            written.model(step.encoder, stem + ".encoder.onnx")
        written.model(step.model, path)
