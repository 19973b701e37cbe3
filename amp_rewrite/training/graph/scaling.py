"""Loss scaling inside the step graph, after PyTorch's GradScaler.

The loss gradient is seeded with the scale; gradients are unscaled in float32;
``found_inf`` is one check of a float32 sum over every unscaled gradient (a NaN or
inf anywhere makes the sum NaN or inf). The step graph then selects old or new
values with ``Where(found_inf, old, new)`` (never a 0/1 product: 0 x NaN is NaN).
Dynamic scaling backs the scale off on ``found_inf`` and resets the count of clean
steps; after ``interval`` clean steps it grows the scale (only if the result is
finite) and resets the count.
"""

from __future__ import annotations

from dataclasses import dataclass

from amp_rewrite.errors import UserError
from amp_rewrite.ir.builder import GraphBuilder


@dataclass(frozen=True)
class LossScale:
    """``mode``: "dynamic", "static" (``init`` stays) or "none" (scale 1, no skipping)."""

    mode: str = "dynamic"
    init: float = 2.0**16
    growth: float = 2.0
    backoff: float = 0.5
    interval: int = 2000

    @classmethod
    def parse(cls, spec: str | float | LossScale) -> LossScale:
        """"dynamic", "none", or a number (a static scale)."""
        if isinstance(spec, LossScale):
            return spec.validated()
        if spec in ("dynamic", "none"):
            return cls(mode=spec, init=1.0 if spec == "none" else cls.init)
        try:
            value = float(spec)
        except (TypeError, ValueError):
            raise UserError(f"--loss-scale must be dynamic, none or a number, got {spec!r}") from None
        return cls(mode="static", init=value).validated()

    def validated(self) -> LossScale:
        if self.mode not in ("dynamic", "static", "none"):
            raise UserError(f"unknown loss-scale mode {self.mode!r}")
        if not self.init > 0 or not self.growth >= 1 or not 0 < self.backoff < 1 or self.interval < 1:
            raise UserError("loss scale: init must be > 0, growth >= 1, 0 < backoff < 1 and interval >= 1")
        return self

    @property
    def checks(self) -> bool:
        """Whether steps with inf/NaN gradients are skipped."""
        return self.mode != "none"


def unscale(b: GraphBuilder, grads: list[str], scale: str) -> list[str]:
    """The gradients divided by the scale."""
    inverse = b.op("Reciprocal", scale)
    return [b.op("Mul", g, inverse) for g in grads]


def non_finite(b: GraphBuilder, grads: list[str]) -> str:
    """A bool scalar: some gradient is inf or NaN."""
    sums = [b.axes_op("ReduceSum", g, None, keepdims=0) for g in grads]
    total = sums[0] if len(sums) == 1 else b.op("Sum", *sums)
    return b.op("Or", b.op("IsNaN", total), b.op("IsInf", total))


def update(b: GraphBuilder, config: LossScale, scale: str, clean: str, found_inf: str) -> tuple[str, str]:
    """(next scale, next count of clean steps); ``clean`` is a float32 scalar."""
    zero, one = b.const(0.0, like=clean), b.const(1.0, like=clean)
    counted = b.op("Add", clean, one)
    due = b.op("GreaterOrEqual", counted, b.const(float(config.interval), like=clean))
    grown = b.op("Mul", scale, b.const(config.growth, like=scale))
    grown = b.op("Where", b.op("IsInf", grown), scale, grown)
    next_clean = b.op("Where", found_inf, zero, b.op("Where", due, zero, counted))
    next_scale = b.op("Where", found_inf, b.op("Mul", scale, b.const(config.backoff, like=scale)),
                      b.op("Where", due, grown, scale))
    return next_scale, next_clean
