"""What ``training_step`` takes, and ``train`` with ``runner.options.FitOptions``: ``StepOptions``,
what the step graph is. It is checked once, where it is made: a bad choice is a UserError from the
constructor, and whoever holds one holds valid choices (the builder re-checks nothing). The CLI
only builds these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from amp_rewrite.autodiff.conv_weight_grad import checked as checked_conv_weight_grad
from amp_rewrite.errors import UserError
from amp_rewrite.rewrite.options import ConvertOptions
from amp_rewrite.training.graph.accumulation import validated as validated_accumulation
from amp_rewrite.training.graph.flat_state import checked as checked_flat_state
from amp_rewrite.training.graph.losses import LOSSES
from amp_rewrite.training.graph.modes import BATCHNORM_MODES
from amp_rewrite.training.graph.optimizers import SGD, AdamW, optimizer
from amp_rewrite.training.graph.scaling import LossScale

PRECISIONS = ("float16", "bfloat16", "float32")


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
    """How Conv weight gradients are formulated (``autodiff.conv_weight_grad.MODES``)."""
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
