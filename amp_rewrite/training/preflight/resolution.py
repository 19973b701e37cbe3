"""Whether a probability output can be fine-tuned at all: its logits within float32's resolution.

A softmax (in any spelling) or a sigmoid of values as large as 2^30 cannot be trained by any
step: float32's spacing there exceeds ``MAX_SPACING``, so logits that an update makes differ
differ by more than that, and e^-MAX_SPACING rounds to zero in float32: the probabilities are
exactly uniform over ties or one-hot, never in between, and every update either does nothing or
saturates them. Models whose weights are placeholders (each tensor one constant, as onnx's light
test models) or whose activations grow without normalization end there. ``logits`` measures the
largest magnitude on the data (data); ``check_resolved`` judges it: one line, before any step
is taken, instead of a run that cannot train.

Invariant: ``check_resolved`` raises only where the output named by the loss is a softmax or
sigmoid whose input, on the first batch, reaches a magnitude where float32's spacing exceeds
``MAX_SPACING``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx

from amp_rewrite.errors import UserError
from amp_rewrite.ir.types import typed_index
from amp_rewrite.runtime import instrument
from amp_rewrite.runtime.expose import expose
from amp_rewrite.runtime.isolate import isolated
from amp_rewrite.training.graph.losses import probability_input

MAX_SPACING = 104.0
"""exp(-104) rounds to zero even as a float32 subnormal: logits this far apart make a one-hot."""


@dataclass(frozen=True)
class Logits:
    """The largest magnitude of an output's logits on a batch."""

    output: str
    op: str
    """The op spelling the probabilities: Softmax or Sigmoid."""
    magnitude: float


def logits(model: onnx.ModelProto, output: str, sample: Mapping[str, np.ndarray]) -> Logits | None:
    """The largest |logit| of ``output`` on ``sample`` (ONNX Runtime, in a child process), where
    ``output`` is a softmax's or sigmoid's; None where it is neither, or the run fails."""
    index = typed_index(model)
    found = probability_input(index, index.values.get((0, output)))
    if found is None:
        return None
    op, value = found
    exposed = expose(model, [(0, value)]).model
    inputs = {i.name for i in model.graph.input}
    feeds = {k: v for k, v in sample.items() if k in inputs}

    def work(progress) -> float:
        array = instrument.run(instrument.session(exposed), feeds, [value])[value]
        return float(np.max(np.abs(array))) if array.size else 0.0

    try:
        return Logits(output, op, isolated(work, "onnxruntime (the output's logits)"))
    except Exception:  # a model the runtime cannot run is refused, with its reason, by what runs it next
        return None


def check_resolved(found: Logits | None) -> None:
    """Refuse (one line) an output whose logits are past float32's resolution (the module's
    docstring)."""
    if found is None or not np.isfinite(found.magnitude):
        return
    spacing = float(np.spacing(np.float32(found.magnitude)))
    if spacing > MAX_SPACING:
        raise UserError(f"output {found.output!r} is a {found.op} of values as large as {found.magnitude:.3g} "
                        f"where float32's spacing is {spacing:.3g}: any update makes its "
                        f"probabilities one-hot, so it cannot be fine-tuned (are the weights placeholders, or do "
                        f"activations grow without normalization?)")
