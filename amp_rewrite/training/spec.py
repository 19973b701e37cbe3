"""The step graph's interface: its inputs and outputs by role (``StepSpec``), what a driver feeds
back each step (``Carried``), written as JSON for drivers in other languages."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


@dataclass
class Carried:
    """A value the driver feeds back: ``input`` this step, ``output`` the next."""

    input: str
    output: str
    shape: list
    dtype: str = "float32"
    role: str = "param"
    """"param", an optimizer state ("momentum", "exp_avg"...), "scale", "clean_steps" or "step"."""
    of: str | None = None
    """The parameter an optimizer state or gradient sum belongs to (None for a flat buffer: ``StepSpec.flat``)."""


@dataclass
class StepSpec:
    """The step graph's interface (``to_json`` for drivers in other languages)."""

    data: list[str]
    labels: str | None
    loss: str
    skipped: str
    outputs: list[str]
    """The model's own outputs, computed by the step's forward."""
    carried: list[Carried]
    lr: str
    weight_decay: str
    precision: str
    optimizer: str
    loss_scale: dict = field(default_factory=dict)
    loss_kind: str | None = None
    """The standard loss attached (one of ``LOSSES``), None where the model's own output is the loss."""
    loss_output: str | None = None
    """The model output a standard loss applies to."""
    extents: dict[str, list[int]] | None = None
    """The data extents a specialized step takes (``build(specialize=...)``); None: any."""
    accumulate: int = 1
    """The micro-batches (steps) that make one update (``accumulation``)."""
    strings: list[str] = field(default_factory=list)
    """The model's string inputs that the encoder (``TrainingStep.encoder``) reads: the step does not."""
    encoded: list[str] = field(default_factory=list)
    """The data inputs the encoder makes of them (``encoders``)."""
    held: list[str] = field(default_factory=list)
    """The float tensors the loss reads that the default parameters leave out: a frozen
    BatchNormalization's running statistics and the formulas' constants (``coefficients``)."""
    flat: list[str] = field(default_factory=list)
    """The parameters whose optimizer states and gradient sums the flat buffers (``build(flat_state="on")``)
    hold, each flattened (row-major), one after another in this order; empty: each has its own."""

    @property
    def params(self) -> list[Carried]:
        return [c for c in self.carried if c.role == "param"]

    @property
    def given(self) -> list[str]:
        """The arrays the user's data holds: the data inputs, the ``encoded`` ones as the ``strings``."""
        return [name for name in self.data if name not in self.encoded] + self.strings

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)
