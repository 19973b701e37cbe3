"""Gradient accumulation inside the step graph: ``count`` micro-batches make one update.

Each step adds its unscaled float32 gradients, divided by ``count``, to a carried sum per
parameter (the mean over micro-batches of each one's mean loss is the gradient of their union,
as one batch ``count`` times larger gives it), and counts micro-batches in a carried float32
scalar. The step that completes ``count`` applies the update with the sums and zeroes them
and the count; the other steps change no weight, optimizer state or step count. An inf or
NaN in any micro-batch's gradients makes the sum inf or NaN, so the check for them reads the
sums once, when they are applied (PyTorch's GradScaler checks the accumulated gradients so),
and the loss scale changes only then: every micro-batch of a window is scaled alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from amp_rewrite.errors import UserError
from amp_rewrite.ir.builder import GraphBuilder

SUM_ROLE, COUNT_ROLE = "grad_sum", "micro_steps"
"""The roles (``Carried.role``) of the gradient sums and of the micro-batch count."""
COUNT = "micro_steps"
"""The carried scalar counting the micro-batches of the window being summed."""


def validated(count: int) -> int:
    if not isinstance(count, int) or count < 1:
        raise UserError(f"--accumulate must be a whole number of micro-batches, at least 1, got {count!r}")
    return count


@dataclass(frozen=True)
class Accumulated:
    """The graph's values of one accumulating step."""

    grads: list[str]
    """The sums so far (this micro-batch's included): the gradients an applied update reads."""
    sums: list[str]
    """The sums to carry: zero after an applied update, else ``grads``."""
    count: str
    """The micro-batch count to carry."""
    apply: str
    """A bool scalar: this micro-batch completes the window."""


def accumulated(b: GraphBuilder, grads: list[str], sums: list[str], count: int) -> Accumulated:
    """Add ``grads`` / ``count`` to the carried ``sums`` (graph inputs, float32, shaped as the
    gradients) and count the micro-batch in ``COUNT``."""
    share = b.const(1.0 / count, like=COUNT)
    added = [b.op("Add", total, b.op("Mul", grad, share)) for total, grad in zip(sums, grads)]
    counted = b.op("Add", COUNT, b.const(1.0, like=COUNT))
    apply = b.op("GreaterOrEqual", counted, b.const(float(count), like=COUNT))
    zero = b.const(0.0, like=COUNT)
    return Accumulated(grads=added, sums=[b.op("Where", apply, zero, total) for total in added],
                       count=b.op("Where", apply, zero, counted), apply=apply)
