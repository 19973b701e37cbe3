"""What ``train`` takes beside ``StepOptions``: ``FitOptions``, how the step runs over the data.
It is checked once, where it is made: a bad choice is a UserError from the constructor."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from amp_rewrite.errors import UserError
from amp_rewrite.training.graph.optimizers import DEFAULT_LR
from amp_rewrite.training.options import StepOptions
from amp_rewrite.training.runner.batching import Batching
from amp_rewrite.training.runner.schedules import Schedule

GRAPH_MODES = {"auto": None, "on": True, "off": False}
"""``FitOptions.graph_mode``'s choices, as ``Trainer(graph_mode=...)`` takes them (``runtime.step_session``)."""


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
    """"auto" (on CUDA), "on", "off": ``runtime.step_session``."""
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
