"""Learning-rate schedules: the factor of the base learning rate at each step (the step graph
reads the rate as an input, so a schedule needs no rebuild).

- ``constant``: 1;
- ``cosine``: from 1 down to 0 along half a cosine over the steps after the warm-up;
- ``step``: times ``gamma`` every ``step_size`` steps after the warm-up.

Any of them may start with ``warmup`` steps whose factor rises linearly from 1/warmup to 1
(the first step is not taken at rate 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from amp_rewrite.errors import UserError

KINDS = ("constant", "cosine", "step")


@dataclass(frozen=True)
class Schedule:
    kind: str = "constant"
    warmup: int = 0
    total: int = 0
    """Steps in all (``cosine`` reaches 0 at the last)."""
    step_size: int = 0
    gamma: float = 0.1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UserError(f"unknown schedule {self.kind!r}; choose one of: {', '.join(KINDS)}")
        if self.warmup < 0 or (self.kind == "step" and self.step_size < 1):
            raise UserError("--warmup-steps must be at least 0, and a step schedule needs --step-size of at least 1")

    def factor(self, step: int) -> float:
        """The factor at ``step`` (0 for the first step)."""
        if step < self.warmup:
            return (step + 1) / self.warmup
        after = step - self.warmup
        if self.kind == "cosine":
            span = max(1, self.total - self.warmup)
            return 0.5 * (1 + math.cos(math.pi * min(after, span) / span))
        if self.kind == "step":
            return self.gamma ** (after // self.step_size)
        return 1.0
