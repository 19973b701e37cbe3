"""``Trainer``: runs a training step graph on ONNX Runtime, keeping its state on the device.

Weights, optimizer state and the loss scale stay in ONNX Runtime buffers between
steps (I/O binding). Two buffer sets are kept and swapped each step: the step reads
one and writes the other, since ONNX Runtime makes no promise about a buffer bound
as both an input and an output (a backward node may still read the old weight).
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite.errors import UserError
from amp_rewrite.inputs import samples
from amp_rewrite.inputs.samples import read_npz
from amp_rewrite.ir import io
from amp_rewrite.ir.builder import FLOAT_TYPES
from amp_rewrite.ir.sizes import iter_graphs
from amp_rewrite.ir.specialize import RANDOM_OPS
from amp_rewrite.rewrite.options import ConvertOptions
from amp_rewrite.rewrite.report import Report, build_report
from amp_rewrite.runtime import instrument
from amp_rewrite.runtime.emulate import LOW_PRECISION_PROVIDERS, emulated
from amp_rewrite.training import attribute_weights, constant_weights, encoders, float32_view
from amp_rewrite.training.accumulation import COUNT
from amp_rewrite.training.batching import Batching
from amp_rewrite.training.flat_state import FLAT
from amp_rewrite.training.graph_mode import CUDA, GRAPH_OPTIONS, FixedBinding, bind_carried, note_refused, wanted
from amp_rewrite.training.losses import reference_loss
from amp_rewrite.training.modes import RUNNING_ROLES
from amp_rewrite.training.schedules import Schedule
from amp_rewrite.training.step import TrainingStep, measured_rewrite

MODEL_STATE = ("param", *RUNNING_ROLES)
"""Carried roles that are initializers of the model (the rest is optimizer and scaler state)."""
PROVIDER_DEFAULTS = {"CUDAExecutionProvider": {"arena_extend_strategy": "kSameAsRequested"}}
"""Provider options the step runs with unless the caller's say otherwise. CUDA's arena grows by
powers of two by default; a step allocates the same buffers every time, so an arena grown by what
it asks holds less device memory in the same time (benchmarks/RESULTS.md, "Training steps on a GPU")."""
SEARCH_STEPS = 24
"""How many times over a first step whose gradients overflow is taken again on its batch (the
dynamic scale halving each time, from 2^16 down to 2^-8 at most) before training moves on."""
SKIP_WARNING = 50
"""Consecutive skipped steps after which the trainer warns (a forward that makes NaN drives
the scale towards zero and skips forever)."""


@dataclass
class StepResult:
    loss: float
    scale: float
    skipped: bool


@dataclass
class History:
    epochs: list[dict] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)
    skipped_steps: list[int] = field(default_factory=list)
    best_epoch: int | None = None
    """The epoch whose weights the trainer ends with, where ``fit`` kept the best."""


class Trainer:
    def __init__(self, step: TrainingStep, provider: str = "CPUExecutionProvider", lr: float = 1e-3,
                 weight_decay: float = 0.0, emulate: bool | None = None,
                 provider_options: Mapping[str, str] | None = None, batching: Batching | None = None,
                 graph_mode: bool | None = None) -> None:
        """``provider_options``: the execution provider's options (ONNX Runtime's names; CUDA's
        ``device_id``, ``gpu_mem_limit``, ``arena_extend_strategy``, ...) over ``PROVIDER_DEFAULTS``;
        the step's values live on ``device_id``'s device.
        ``emulate`` (default: unless the provider runs float16 natively) runs the step with every
        low-precision value rounded where it is produced (``runtime.emulate``): the CPU provider
        computes most float16 nodes in float32 and drops the roundings between them, so without
        emulation a float16 step there would neither overflow nor underflow as it does on a GPU.
        ``graph_mode`` (default: on CUDA, for a step of fixed extents) binds every input and output
        of the step at a fixed address and, on CUDA, runs it as CUDA graphs (``training.graph_mode``);
        where ONNX Runtime refuses them, one note on stderr and the trainer goes on without."""
        self.step_graph = step
        self.spec = step.spec
        self.lr, self.weight_decay = lr, weight_decay
        self.batching = batching or Batching()
        """Where the data arrays hold their samples (``fit``, ``evaluate``)."""
        self.encoding = encoders.Encoding(step.encoder)
        """The model's encoders of its string inputs: every array of strings given is run through
        them before the step, ``evaluate`` or ``check_loss`` sees it (``training.encoders``)."""
        self.provider = provider
        self.device = "cuda" if provider == "CUDAExecutionProvider" else "cpu"
        provider_options = {**PROVIDER_DEFAULTS.get(provider, {}), **(provider_options or {})}
        self.device_id = int(provider_options.get("device_id", 0))
        self.emulated = provider not in LOW_PRECISION_PROVIDERS if emulate is None else emulate
        self._model, self._provider_options = emulated(step.model) if self.emulated else step.model, provider_options
        self.graph_mode = wanted(graph_mode, provider, self.spec)
        """Whether the step is bound at fixed addresses (``graph_mode.FixedBinding``)."""
        graphs = self.graph_mode and provider == CUDA
        if graphs:
            try:
                self.session = self._open(GRAPH_OPTIONS)
            except UserError:  # not a refusal of the graphs: the provider is not there
                raise
            except Exception as exc:
                note_refused(exc)
                graphs = self.graph_mode = False
        if not graphs:
            with instrument.refusals("the training step", provider):  # a step ONNX Runtime refuses: one line
                self.session = self._open({})
        self._buffers = [{c.input: self._device_value(step.initial[c.input]) for c in self.spec.carried},
                         {c.input: self._device_value(np.zeros_like(step.initial[c.input]))
                          for c in self.spec.carried}]
        self._fixed = FixedBinding(self._model, self.session, self.spec, list(self._buffers), self._device_value,
                                   graphs) if self.graph_mode else None
        self.steps = 0
        self.consecutive_skips = 0
        self.searching = step.spec.loss_scale["mode"] == "dynamic" and step.spec.accumulate == 1
        """Whether no update has been applied yet: a skipped step is then the dynamic scale's search
        for one the gradients fit, and ``fit`` takes it again on the same batch (no batch of a short
        fine-tune is lost to the descent from the initial scale). A window of accumulated
        micro-batches is skipped whole, so steps that accumulate do not search."""
        self.searched = 0
        """Steps ``fit`` took again in that search (the schedule does not count them)."""

    def _open(self, options: Mapping[str, str]):
        """The step's session, with ``options`` over the provider's (basic optimizations only: fusions
        across the casts would change the precision chosen)."""
        return instrument.session(self._model, None, self.provider, optimize="basic",
                                  provider_options={**self._provider_options, **options})

    def _device_value(self, array: np.ndarray):
        """A copy of ``array`` on the step's device (on the CPU an OrtValue shares its array's memory,
        which the step writes over: the step's first values must stay as they were)."""
        import onnxruntime as ort

        return ort.OrtValue.ortvalue_from_numpy(np.array(array, order="C"), self.device, self.device_id)

    # -- one step ---------------------------------------------------------------------------------
    def step(self, batch: Mapping[str, np.ndarray]) -> StepResult:
        """One training step on ``batch`` (arrays keyed by the step's data inputs; an input given
        as an ``onnxruntime.OrtValue``, from ``device_batch``, is read where it lies, uncopied, or in
        graph mode copied on the device into its fixed buffer; string inputs as arrays of str)."""
        batch = self.encoding(batch)
        missing = [name for name in self.spec.data if name not in batch]
        if missing:
            raise UserError(f"the batch lacks {', '.join(missing)}")
        current, following = self._buffers
        if self._fixed is not None:
            self._fixed.fill(batch, self.lr, self.weight_decay)
        with instrument.refusals("the training step", self.provider, raised_as=(RuntimeError,)):
            loss, flag = self._fixed_run(batch) if self._fixed is not None else self._run(batch)
        self._buffers = [following, current]
        self.steps += 1
        skipped = bool(flag)
        self.searching = self.searching and skipped
        self.consecutive_skips = self.consecutive_skips + 1 if skipped else 0
        if self.consecutive_skips == SKIP_WARNING:
            print(f"amp-rewrite: warning: {SKIP_WARNING} steps in a row skipped for inf/NaN gradients (scale "
                  f"{self.scale:g}); if the forward itself makes NaN, loss scaling cannot help", file=sys.stderr)
        return StepResult(float(loss), self.scale, skipped)

    def _run(self, batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """One run bound as it comes: the batch and the hyper-parameters from the host, the loss and the
        skipped flag to it."""
        import onnxruntime as ort

        binding = self.session.io_binding()
        for name in self.spec.data:
            if isinstance(batch[name], ort.OrtValue):
                binding.bind_ortvalue_input(name, batch[name])
            else:
                binding.bind_cpu_input(name, np.asarray(float32_view.as_float32(batch[name]), order="C"))
        binding.bind_cpu_input(self.spec.lr, np.array(self.lr, np.float32))
        binding.bind_cpu_input(self.spec.weight_decay, np.array(self.weight_decay, np.float32))
        bind_carried(binding, self.spec.carried, *self._buffers)
        for name in (self.spec.loss, self.spec.skipped):
            binding.bind_output(name, "cpu")
        self.session.run_with_iobinding(binding)
        loss, skipped = (value.numpy() for value in binding.get_outputs()[-2:])  # bound last
        return loss, skipped

    def _fixed_run(self, batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """One run of the fixed binding (its buffers filled); where a first run fails as CUDA graphs
        are captured, the note, and this step and the rest bound as they come, in a session without
        graphs (a failed run wrote only the buffer set the step writes)."""
        assert self._fixed is not None
        try:
            return self._fixed.run(self._buffers[0])
        except Exception as exc:
            if not self._fixed.warming:
                raise
            note_refused(exc)
        self.session, self._fixed, self.graph_mode = self._open({}), None, False
        return self._run(batch)

    def device_batch(self, batch: Mapping[str, np.ndarray]) -> dict:
        """``batch`` copied to the step's device once, for steps that reuse it (a benchmark, data
        that fits on the device)."""
        return {name: self._device_value(array) for name, array in self.encoding(batch).items()}

    def value(self, name: str) -> np.ndarray:
        """The current value of a carried input (a weight, an optimizer state, the scale), copied: the
        step writes its buffers over in place (on the CPU, ``OrtValue.numpy`` shares them)."""
        return self._buffers[0][name].numpy().copy()

    @property
    def scale(self) -> float:
        return float(self.value("loss_scale"))

    @property
    def weights(self) -> dict[str, np.ndarray]:
        """The model's trained initializers: parameters and BatchNormalization running statistics."""
        return {c.input: self.value(c.input) for c in self.spec.carried if c.role in MODEL_STATE}

    # -- epochs -----------------------------------------------------------------------------------
    def fit(self, data: Mapping[str, np.ndarray], epochs: int = 1, batch_size: int = 32,
            eval_data: Mapping[str, np.ndarray] | None = None, seed: int = 0, progress: bool = True,
            schedule: Schedule | None = None, first_epoch: int = 1,
            checkpoints: str | os.PathLike | None = None, keep_best: bool = False) -> History:
        """Shuffled mini-batches for epochs ``first_epoch`` to ``epochs`` (the orders drawn from
        ``seed`` in turn, the done epochs' too, so a resumed run shuffles as the whole one would);
        returns the per-epoch history. ``schedule`` scales the learning rate given to the
        trainer at each step. ``checkpoints``: a folder that gets ``epoch-N.npz`` after each
        epoch (``save``). ``keep_best``: with ``eval_data``, the weights end as they were after
        the epoch of the lowest evaluation loss."""
        data = self.encoding(data)
        count = self.batching.count(data, self.spec.data)
        history = History()
        live = progress and sys.stderr.isatty()
        base_lr = self.lr
        best = None
        rng = np.random.default_rng(seed)
        for _ in range(1, first_epoch):  # the orders of the epochs a resumed run has done
            rng.permutation(count)
        for epoch in range(first_epoch, epochs + 1):
            order = rng.permutation(count)
            losses, skipped, started = [], 0, time.perf_counter()
            batches = math.ceil(count / batch_size)
            for k in range(batches):
                rows = order[k * batch_size:(k + 1) * batch_size]
                batch = self.batching.take(data, self.spec.data, rows)
                if not self._fits(batch):  # a specialized step's last, partial batch
                    continue
                if schedule is not None:
                    self.lr = base_lr * schedule.factor((self.steps - self.searched) // self.spec.accumulate)
                while True:  # once, or again while the scale searches (``searching``)
                    result = self.step(batch)
                    history.scales.append(result.scale)
                    if result.skipped:
                        skipped += 1
                        history.skipped_steps.append(self.steps)
                    if not (result.skipped and self.searching and self.searched < SEARCH_STEPS):
                        break
                    self.searched += 1
                losses.append(result.loss)
                if live:
                    rate = (k + 1) * batch_size / max(time.perf_counter() - started, 1e-9)
                    print(f"\repoch {epoch}/{epochs} [{k + 1}/{batches}] loss {result.loss:.4g} scale "
                          f"{result.scale:g} skipped {skipped} {rate:.0f} samples/s", end="", file=sys.stderr)
            finite = [v for v in losses if math.isfinite(v)]
            record: dict[str, Any] = {"epoch": epoch, "loss": float(np.mean(finite)) if finite else float("nan"),
                      "skipped": skipped, "seconds": time.perf_counter() - started, "scale": self.scale}
            if eval_data is not None:
                record["eval"] = self.evaluate(eval_data, batch_size)
            history.epochs.append(record)
            if progress:
                print(f"\r{describe(record)}", file=sys.stderr)
            if keep_best and "eval" in record and (best is None or record["eval"]["loss"] < best[0]):
                best = (record["eval"]["loss"], epoch, self.state())
            if checkpoints is not None:
                self.save(Path(checkpoints) / f"epoch-{epoch}.npz", epoch)
        self.lr = base_lr
        if best is not None:
            self.load(best[2])
            history.best_epoch = best[1]
        self.check_loss(data, batch_size)  # one batch: a model may take no other extent
        return history

    def _fits(self, batch: Mapping[str, np.ndarray]) -> bool:
        """Whether a specialized step (``StepSpec.extents``) takes ``batch``."""
        extents = self.spec.extents
        return extents is None or all(list(np.shape(batch[n])) == e for n, e in extents.items() if n in batch)

    # -- checkpoints ------------------------------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        """Every carried value (weights, optimizer states, loss scale, step count), copied."""
        return {c.input: self.value(c.input) for c in self.spec.carried}

    def load(self, state: Mapping[str, np.ndarray]) -> None:
        """Carried values from ``state`` (``state()``, or a checkpoint's arrays): all of them, shaped as the step's."""
        missing = [c.input for c in self.spec.carried if c.input not in state]
        if missing:
            layout = any(name.startswith(f"{FLAT}.") for name in state) != bool(self.spec.flat)
            raise UserError(f"the checkpoint lacks {', '.join(missing[:5])}: it was written for another step"
                            + (" (its optimizer states in the other --flat-state layout)" if layout else ""))
        for carried in self.spec.carried:
            value = np.asarray(state[carried.input], np.float32)
            if list(value.shape) != list(carried.shape):
                raise UserError(f"the checkpoint's {carried.input!r} has shape {list(value.shape)}, the step's "
                                f"{carried.shape}: it was written for another model")
            self._buffers[0][carried.input].update_inplace(value)  # in place: a fixed binding holds it
        self.searching, self.searched = False, 0  # the checkpoint's scale is one the gradients fit
        if "step" in state:  # updates taken, and the micro-batches of the window being summed
            self.steps = int(np.asarray(state["step"])) * self.spec.accumulate + int(state.get(COUNT, 0))

    def save(self, path: str | os.PathLike, epoch: int) -> None:
        """A checkpoint: every carried value and the epoch it ends, written whole or not at all."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        io.save_arrays(path, {**self.state(), EPOCH_KEY: np.array(epoch)})

    def resume(self, path: str | os.PathLike) -> int:
        """Load a checkpoint (``save``); the epoch it ended."""
        arrays = read_npz(path)
        if EPOCH_KEY not in arrays:
            raise UserError(f"{path} is not a checkpoint of amp-rewrite train (no {EPOCH_KEY})")
        self.load(arrays)
        return int(arrays[EPOCH_KEY])

    def check_loss(self, data: Mapping[str, np.ndarray], rows: int = 256) -> None:
        """That the loss the step reports is the standard loss of the trained model's own output
        (``losses.reference_loss``, on up to ``rows`` samples of ``data``): a UserError where
        they disagree. A cross-entropy taken of probabilities as if they were logits falls while
        the real cross-entropy rises."""
        spec = self.spec
        if (spec.loss_kind is None or spec.labels is None  # (a standard loss has its labels)
                or self.batching.axis(spec.labels) != 0 or spec.labels in self.batching.fixed):
            return  # the reference reads samples on axis 0
        feeds = self.batching.take(self.encoding(data), spec.data, slice(0, rows))
        session = instrument.session(self.with_weights(self.step_graph.forward))
        with instrument.refusals("the model", "CPUExecutionProvider"):
            (output,) = session.run([spec.loss_output], feeds)
            found = reference_loss(spec.loss_kind, output, feeds[spec.labels])
            if found is None:
                return
            expected, kept = found
            (reported,) = session.run([spec.loss], self.batching.take(feeds, spec.data, kept))
        if not (math.isfinite(float(reported)) and math.isfinite(expected)):
            raise UserError(f"training diverged: the trained model's {spec.loss_kind} loss is {float(reported):g} "
                            f"(the updates took its weights where its outputs are no longer finite); lower --lr")
        if not math.isclose(float(reported), expected, rel_tol=LOSS_RTOL, abs_tol=LOSS_ATOL):
            raise UserError(f"the {spec.loss_kind} loss the step computes ({float(reported):.6g}) is not the "
                            f"{spec.loss_kind} of {spec.loss_output!r} ({expected:.6g} from its own values): its "
                            f"values are probabilities written in a way the loss did not recognize; pass the "
                            f"logits output as --output")

    def evaluate(self, data: Mapping[str, np.ndarray], batch_size: int = 256) -> dict[str, float]:
        """Mean loss of the float32 model with the current weights (and accuracy for a
        cross-entropy loss), on ONNX Runtime's CPU provider."""
        session = instrument.session(self.with_weights(self.step_graph.forward))
        names = [self.spec.loss, *self.spec.outputs[:1]]
        inputs = self.spec.data
        data = self.encoding(data)
        count = self.batching.count(data, inputs)
        total, correct = 0.0, 0
        labels = self.spec.labels
        classes = labels is not None and data[labels].dtype.kind in "iu"
        for start in range(0, count, batch_size):
            feeds = self.batching.take(data, inputs, slice(start, start + batch_size))
            with instrument.refusals("the model", "CPUExecutionProvider"):
                loss, *outputs = session.run(names, feeds)
            rows = min(batch_size, count - start)
            total += float(loss) * rows
            if classes and labels is not None and outputs and outputs[0].ndim == 2:
                correct += int(np.sum(outputs[0].argmax(axis=1) == feeds[labels]))
        result = {"loss": total / count}
        if classes:
            result["accuracy"] = correct / count
        return result

    # -- export -----------------------------------------------------------------------------------
    def with_weights(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """A copy of ``model`` whose weights are the trained ones (same graph)."""
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        weights = self.weights
        for tensor in copy.graph.initializer:
            if tensor.name in weights:
                trained = weights[tensor.name].astype(numpy_helper.to_array(tensor).dtype)
                tensor.CopyFrom(numpy_helper.from_array(trained, tensor.name))
        constant_weights.written_back(copy, weights)  # weights the model holds in Constant nodes
        attribute_weights.written_back(copy, weights)  # and in ai.onnx.ml's attributes
        return copy

    def exported(self, check_on: Mapping[str, np.ndarray] | None = None) -> onnx.ModelProto:
        """The input model, graph unchanged, with the trained weights (in each weight's own type);
        ``check_on``: data whose first samples it must compute as the trained step's forward does
        (``check_export``; its strings as they are), else a UserError."""
        exported = self.with_weights(self.step_graph.original)
        if check_on is not None:
            self.check_export(exported, check_on)
        return exported

    def check_export(self, exported: onnx.ModelProto, data: Mapping[str, np.ndarray], rows: int = 8) -> None:
        """That ``exported`` (the input model with the trained weights written back: into
        initializers, Constant nodes, ai.onnx.ml attributes, float16 or float64 tensors, a fused
        ONNX Runtime graph) computes on ``rows`` samples of ``data`` the float outputs the trained
        forward computes: a UserError naming the output where they disagree. A model with random
        ops, or one ONNX Runtime cannot run, is not checked. ``data`` holds the model's string inputs
        as strings: the exported model reads them, the forward what the encoder makes of them."""
        if any(n.op_type in RANDOM_OPS for graph in iter_graphs(exported.graph) for n in graph.node):
            return
        feeds = self.batching.take(data, self.spec.given, slice(0, rows))
        elem = {v.name: v.type.tensor_type.elem_type for v in (*exported.graph.input, *exported.graph.output)}
        given = {name: np.asarray(feeds[name], helper.tensor_dtype_to_np_dtype(elem[name])) if elem[name] in FLOAT_TYPES
                 else feeds[name] for name in samples.graph_inputs(exported) if name in feeds}
        try:
            session = instrument.session(exported)
            written = dict(zip((o.name for o in session.get_outputs()), session.run(None, given)))
        except Exception:  # the input model itself may be one ONNX Runtime refuses
            return
        forward = instrument.session(self.with_weights(self.step_graph.forward))
        names = [o.name for o in forward.get_outputs() if elem.get(o.name) in _EXPORT_RTOL and o.name in written]
        for name, want in zip(names, forward.run(names, dict(self.encoding(feeds)))):
            got = np.asarray(written[name], np.float64)
            scale = float(np.max(np.abs(want))) if np.size(want) else 0.0
            if got.shape != np.shape(want) or np.any(np.abs(got - want) > _EXPORT_RTOL[elem[name]] * scale
                                                     + EXPORT_ATOL):
                worst = float(np.max(np.abs(got - want))) if got.shape == np.shape(want) else float("nan")
                raise UserError(f"the exported model's output {name!r} differs from the trained step's (largest "
                                f"difference {worst:.3g}, outputs up to {scale:.3g}): the weights did not go back "
                                f"into the model as they were trained; nothing was written")

    def mixed(self) -> tuple[onnx.ModelProto, Report]:
        """The trained model's mixed-precision rewrite, with the options the step was built with."""
        view = onnx.ModelProto.FromString(self.step_graph.original.SerializeToString())
        float32_view.viewed(view)  # the float32 master weights go into the float32 model it rewrites
        proto = self.with_weights(view)
        analysis, stats = measured_rewrite(proto, (self.step_graph.options or ConvertOptions()).validated())
        return proto, build_report(analysis, stats)


_EXPORT_RTOL = {TensorProto.FLOAT: 1e-4, TensorProto.DOUBLE: 1e-4, TensorProto.FLOAT16: 1e-2,
                TensorProto.BFLOAT16: 5e-2}
"""How far (relative to the output's largest magnitude) an exported model's output may stray from
the trained forward's, by its type: the same computation in another graph form (float32 sums
reordered), or rounded to the model's own float16."""
EXPORT_ATOL = 1e-5
EPOCH_KEY = "__epoch__"
"""A checkpoint's array that holds the epoch it ends (``Trainer.save``)."""
LOSS_RTOL, LOSS_ATOL = 1e-3, 1e-5
"""How close the step's loss and the loss of the model's own output must be (``check_loss``):
float32 reductions over a batch, against float64."""


def describe(record: dict) -> str:
    """One line for an epoch's record."""
    line = (f"epoch {record['epoch']}: loss {record['loss']:.4g}, {record['skipped']} skipped, scale "
            f"{record['scale']:g}, {record['seconds']:.2f} s")
    evaluation = record.get("eval")
    if evaluation:
        line += f"; eval loss {evaluation['loss']:.4g}"
        if "accuracy" in evaluation:
            line += f", accuracy {evaluation['accuracy']:.1%}"
    return line
