"""What ``train`` and ``training_step`` take: ``StepOptions`` (what the step graph is) and
``FitOptions`` (how it is run over the data). Each is checked once, where it is made: a bad choice
is a UserError from the constructor, and whoever holds one holds valid choices (the builder and
the runner re-check nothing). The CLI only builds these.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from amp_rewrite.autodiff.conv_weight_grad import checked as checked_conv_weight_grad
from amp_rewrite.errors import UserError
from amp_rewrite.rewrite.options import ConvertOptions
from amp_rewrite.training.graph.accumulation import validated as validated_accumulation
from amp_rewrite.training.graph.flat_state import checked as checked_flat_state
from amp_rewrite.training.graph.losses import LOSSES
from amp_rewrite.training.graph.modes import BATCHNORM_MODES
from amp_rewrite.training.graph.optimizers import DEFAULT_LR, SGD, AdamW, optimizer
from amp_rewrite.training.graph.scaling import LossScale
from amp_rewrite.training.runner.batching import Batching
from amp_rewrite.training.runner.schedules import Schedule

PRECISIONS = ("float16", "bfloat16", "float32")
GRAPH_MODES = {"auto": None, "on": True, "off": False}
"""``FitOptions.graph_mode``'s choices, as ``Trainer(graph_mode=...)`` takes them (``training.graph_mode``)."""


@dataclass(frozen=True)
class StepOptions:
    """One training step: the loss, what trains, the optimizer, precision and loss scaling, and how
    the gradients are formulated. ``optimizer`` and ``loss_scale`` may be given by name ("adamw",
    "dynamic", a number) and hold the objects once made (:class:`AdamW`, :class:`LossScale`)."""

    loss: str = "loss"
    """A scalar float output of the model, or a standard loss (``LOSSES``: "cross-entropy", "mse")
    attached to ``output`` with a new input ``labels``."""
    output: str | None = None
    labels: str = "labels"
    params: Sequence[str] | None = None
    """The initializers to train (None: every float initializer the loss depends on, but a frozen
    BatchNormalization's running statistics and the formulas' one-element constants)."""
    train: Sequence[str] = ()
    """Regular expressions searched in each parameter's name and its readers' names: only the
    parameters one finds train (all where none is given)."""
    freeze: Sequence[str] = ()
    """Regular expressions as ``train``: the parameters one finds stay constants of the model."""
    optimizer: str | SGD | AdamW = "adamw"
    precision: str = "float16"
    """"float16", "bfloat16", or "float32" (no rewrite); overrides ``convert``'s."""
    loss_scale: str | float | LossScale | None = None
    """"dynamic" (None's meaning for float16), "none" (None's otherwise), a number (static)."""
    clip_norm: float | None = None
    """The gradients' global L2 norm is clipped to it, in float32, after unscaling."""
    accumulate: int = 1
    """Micro-batches whose gradients are summed into one update."""
    batchnorm: str = "auto"
    """"train" (batch statistics, running ones updated), "freeze", or "auto" (``modes.batchnorm_mode``)."""
    conv_weight_grad: str = "direct"
    """How Conv weight gradients are formulated (``autodiff.rules.conv_weight_grad.MODES``)."""
    flat_state: str = "off"
    """"on": one flat float32 buffer per optimizer state (``flat_state``)."""
    convert: ConvertOptions | None = None
    """The mixed-precision rewrite's options (policy, provider, overrides)."""

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise UserError(f"unknown precision {self.precision!r}; choose one of: {', '.join(PRECISIONS)}")
        if self.batchnorm not in BATCHNORM_MODES:
            raise UserError(f"batchnorm must be one of {', '.join(BATCHNORM_MODES)}, got {self.batchnorm!r}")
        if self.clip_norm is not None and not self.clip_norm > 0:
            raise UserError(f"--clip-norm must be a positive number, got {self.clip_norm}")
        if self.loss in LOSSES and self.output is None:
            raise UserError(f"a {self.loss} loss needs the model output it applies to (--output)")
        for name in ("params", "train", "freeze"):
            value = getattr(self, name)
            if isinstance(value, str):  # one name is not a list of its characters
                raise UserError(f"{name} takes a list of names or patterns, got the string {value!r}")
            if value is not None:
                object.__setattr__(self, name, tuple(value))
        validated_accumulation(self.accumulate)
        checked_conv_weight_grad(self.conv_weight_grad)
        checked_flat_state(self.flat_state)
        scale = self.loss_scale if self.loss_scale is not None else "dynamic" if self.precision == "float16" else "none"
        object.__setattr__(self, "loss_scale", LossScale.parse(scale))
        object.__setattr__(self, "optimizer", optimizer(self.optimizer))
        if self.convert is not None and not isinstance(self.convert, ConvertOptions):
            raise UserError("convert takes a ConvertOptions")

    @property
    def scaling(self) -> LossScale:
        assert isinstance(self.loss_scale, LossScale)  # made one in __post_init__
        return self.loss_scale

    @property
    def update(self) -> SGD | AdamW:
        assert isinstance(self.optimizer, (SGD, AdamW))  # made one in __post_init__
        return self.optimizer


@dataclass(frozen=True)
class FitOptions:
    """How the step runs over the data: epochs, batches, the learning rate and its schedule,
    checkpoints, the execution provider and graph mode."""

    epochs: int = 1
    batch_size: int = 32
    lr: float | None = None
    """The base learning rate (None: ``DEFAULT_LR`` of the step's optimizer)."""
    weight_decay: float = 0.0
    schedule: Schedule = field(default_factory=Schedule)
    """Its ``total`` is filled in from the data (the updates of all the epochs)."""
    batching: Batching = field(default_factory=Batching)
    """Where the data arrays hold their samples."""
    seed: int = 0
    """Of the shuffling."""
    provider: str = "CPUExecutionProvider"
    provider_options: Mapping[str, str] = field(default_factory=dict)
    graph_mode: str = "auto"
    """"auto" (on CUDA), "on", "off": ``training.graph_mode``."""
    checkpoints: str | os.PathLike | None = None
    """A folder that gets ``epoch-N.npz`` after every epoch."""
    resume: str | os.PathLike | None = None
    """A checkpoint to start from, at the epoch after it."""
    keep_best: bool = False
    """With evaluation data: end with the weights of the epoch of the lowest evaluation loss."""
    progress: bool = True
    """A progress line per step and a line per epoch on stderr (a live line only on a terminal)."""

    def __post_init__(self) -> None:
        if not isinstance(self.epochs, int) or not isinstance(self.batch_size, int) \
                or self.epochs < 1 or self.batch_size < 1:
            raise UserError("--epochs and --batch-size must be whole numbers, at least 1")
        if self.graph_mode not in GRAPH_MODES:
            raise UserError(f"graph_mode must be one of {', '.join(GRAPH_MODES)}, got {self.graph_mode!r}")
        if self.lr is not None and not self.lr >= 0:
            raise UserError(f"--lr must be a number, at least 0, got {self.lr}")
        if not isinstance(self.schedule, Schedule) or not isinstance(self.batching, Batching):
            raise UserError("schedule takes a Schedule, batching a Batching")

    @property
    def graphs(self) -> bool | None:
        """``graph_mode`` as ``Trainer`` takes it: True, False, or None (on CUDA)."""
        return GRAPH_MODES[self.graph_mode]

    def rate(self, step: StepOptions) -> float:
        """The base learning rate for ``step``'s optimizer."""
        return self.lr if self.lr is not None else DEFAULT_LR[step.update.name]

    def scheduled(self, updates: int) -> Schedule:
        """The schedule over ``updates`` updates in all."""
        return replace(self.schedule, total=updates)
