"""``Trainer``: the training loop over a step graph, its state on the device between steps
(``runtime.step_session``), with checkpoints, evaluation and the export of the trained model."""

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

from amp_rewrite.errors import UserError
from amp_rewrite.rewrite.report import Report
from amp_rewrite.runtime.emulate import LOW_PRECISION_PROVIDERS, emulated
from amp_rewrite.runtime.step_session import StepIO, StepSession, is_device_value
from amp_rewrite.training.adapters import encoders, float32_view
from amp_rewrite.training.graph.accumulation import COUNT
from amp_rewrite.training.graph.modes import RUNNING_ROLES
from amp_rewrite.training.runner import checkpoints, evaluation, export
from amp_rewrite.training.runner.batching import Batching
from amp_rewrite.training.runner.schedules import Schedule
from amp_rewrite.training.step import TrainingStep

MODEL_STATE = ("param", *RUNNING_ROLES)
"""Carried roles that are initializers of the model (the rest is optimizer and scaler state)."""
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
        ``device_id``, ``gpu_mem_limit``, ``arena_extend_strategy``, ...) over
        ``step_session.PROVIDER_DEFAULTS``; the step's values live on ``device_id``'s device.
        ``emulate`` (default: unless the provider runs float16 natively) runs the step with every
        low-precision value rounded where it is produced (``runtime.emulate``): the CPU provider
        computes most float16 nodes in float32 and drops the roundings between them, so without
        emulation a float16 step there would neither overflow nor underflow as it does on a GPU.
        ``graph_mode`` (default: on CUDA, for a step of fixed extents) binds every input and output
        of the step at a fixed address and, on CUDA, runs it as CUDA graphs (``step_session``);
        where ONNX Runtime refuses them, one note on stderr and the trainer goes on without."""
        self.step_graph = step
        self.spec = spec = step.spec
        self.lr, self.weight_decay = lr, weight_decay
        self.batching = batching or Batching()
        """Where the data arrays hold their samples (``fit``, ``evaluate``)."""
        self.encoding = encoders.Encoding(step.encoder)
        """The model's encoders of its string inputs: every array of strings given is run through
        them before the step, ``evaluate`` or ``check_loss`` sees it (``training.adapters.encoders``)."""
        self.provider = provider
        self.emulated = provider not in LOW_PRECISION_PROVIDERS if emulate is None else emulate
        io = StepIO(spec.data, (spec.lr, spec.weight_decay), [(c.input, c.output) for c in spec.carried], spec.loss,
                    spec.skipped, spec.extents)
        self.session = StepSession(emulated(step.model) if self.emulated else step.model, io, step.initial, provider,
                                   provider_options, graph_mode)
        self.steps = 0
        self.consecutive_skips = 0
        self.searching = spec.loss_scale["mode"] == "dynamic" and spec.accumulate == 1
        """Whether no update has been applied yet: a skipped step is then the dynamic scale's search
        for one the gradients fit, and ``fit`` takes it again on the same batch (no batch of a short
        fine-tune is lost to the descent from the initial scale). A window of accumulated
        micro-batches is skipped whole, so steps that accumulate do not search."""
        self.searched = 0
        """Steps ``fit`` took again in that search (the schedule does not count them)."""

    @property
    def graph_mode(self) -> bool:
        """Whether the step is bound at fixed addresses (false once ONNX Runtime refused the graphs)."""
        return self.session.graph_mode

    # -- one step ---------------------------------------------------------------------------------
    def step(self, batch: Mapping[str, np.ndarray]) -> StepResult:
        """One training step on ``batch`` (arrays keyed by the step's data inputs; an input given
        as a device value, from ``device_batch``, is read where it lies, uncopied, or in graph mode
        copied on the device into its fixed buffer; string inputs as arrays of str)."""
        batch = self.encoding(batch)
        missing = [name for name in self.spec.data if name not in batch]
        if missing:
            raise UserError(f"the batch lacks {', '.join(missing)}")
        fed = {name: batch[name] if is_device_value(batch[name]) else float32_view.as_float32(batch[name])
               for name in self.spec.data}
        loss, flag = self.session.run(fed, {self.spec.lr: self.lr, self.spec.weight_decay: self.weight_decay})
        self.steps += 1
        skipped = bool(flag)
        self.searching = self.searching and skipped
        self.consecutive_skips = self.consecutive_skips + 1 if skipped else 0
        if self.consecutive_skips == SKIP_WARNING:
            print(f"amp-rewrite: warning: {SKIP_WARNING} steps in a row skipped for inf/NaN gradients (scale "
                  f"{self.scale:g}); if the forward itself makes NaN, loss scaling cannot help", file=sys.stderr)
        return StepResult(float(loss), self.scale, skipped)

    def device_batch(self, batch: Mapping[str, np.ndarray]) -> dict:
        """``batch`` copied to the step's device once, for steps that reuse it (a benchmark, data
        that fits on the device)."""
        return {name: self.session.device_value(array) for name, array in self.encoding(batch).items()}

    def value(self, name: str) -> np.ndarray:
        """The current value of a carried input (a weight, an optimizer state, the scale), copied."""
        return self.session.value(name)

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
                                      "skipped": skipped, "seconds": time.perf_counter() - started,
                                      "scale": self.scale}
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
        # one batch: a model may take no other extent
        evaluation.check_loss(self._forward(), self.spec, self.batching, data, batch_size)
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
        for name, value in checkpoints.checked(self.spec, state).items():
            self.session.load(name, value)
        self.searching, self.searched = False, 0  # the checkpoint's scale is one the gradients fit
        if "step" in state:  # updates taken, and the micro-batches of the window being summed
            self.steps = int(np.asarray(state["step"])) * self.spec.accumulate + int(state.get(COUNT, 0))

    def save(self, path: str | os.PathLike, epoch: int) -> None:
        """A checkpoint: every carried value and the epoch it ends (``checkpoints``)."""
        checkpoints.write(path, self.state(), epoch)

    def resume(self, path: str | os.PathLike) -> int:
        """Load a checkpoint (``save``); the epoch it ended."""
        state, epoch = checkpoints.read(path)
        self.load(state)
        return epoch

    # -- the trained model ------------------------------------------------------------------------
    def evaluate(self, data: Mapping[str, np.ndarray], batch_size: int = 256) -> dict[str, float]:
        """Mean loss of the float32 model with the current weights (and accuracy for a
        cross-entropy loss), on ONNX Runtime's CPU provider."""
        return evaluation.evaluate(self._forward(), self.spec, self.batching, self.encoding(data), batch_size)

    def with_weights(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """A copy of ``model`` (the model as given, or a lowered form) whose weights are the trained ones."""
        return export.with_weights(model, self.weights)

    def _forward(self) -> onnx.ModelProto:
        return self.with_weights(self.step_graph.forward)

    def exported(self, check_on: Mapping[str, np.ndarray] | None = None) -> onnx.ModelProto:
        """The input model, graph unchanged, with the trained weights (in each weight's own type);
        ``check_on``: data whose first samples it must compute as the trained step's forward does
        (``export.check_export``; its strings as they are), else a UserError."""
        exported = self.with_weights(self.step_graph.original)
        if check_on is not None:
            export.check_export(exported, self._forward(), self.spec.given, self.batching, self.encoding, check_on)
        return exported

    def mixed(self) -> tuple[onnx.ModelProto, Report]:
        """The trained model's mixed-precision rewrite, with the options the step was built with."""
        return export.mixed(self.step_graph.original, self.weights, self.step_graph.options)


def describe(record: dict) -> str:
    """One line for an epoch's record."""
    line = (f"epoch {record['epoch']}: loss {record['loss']:.4g}, {record['skipped']} skipped, scale "
            f"{record['scale']:g}, {record['seconds']:.2f} s")
    evaluation_record = record.get("eval")
    if evaluation_record:
        line += f"; eval loss {evaluation_record['loss']:.4g}"
        if "accuracy" in evaluation_record:
            line += f", accuracy {evaluation_record['accuracy']:.1%}"
    return line
