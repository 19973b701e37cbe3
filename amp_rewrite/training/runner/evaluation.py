"""The trained model judged in float32: its mean loss and accuracy on data (``evaluate``), and the
step's reported loss checked against the loss of the model's own output (``check_loss``). Both run
the step's float32 forward with the trained weights on ONNX Runtime's CPU provider."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import onnx

from amp_rewrite.errors import UserError
from amp_rewrite.runtime import instrument
from amp_rewrite.training.graph.losses import reference_loss
from amp_rewrite.training.runner.batching import Batching
from amp_rewrite.training.spec import StepSpec

LOSS_RTOL, LOSS_ATOL = 1e-3, 1e-5
"""How close the step's loss and the loss of the model's own output must be (``check_loss``):
float32 reductions over a batch, against float64."""


def evaluate(forward: onnx.ModelProto, spec: StepSpec, batching: Batching, data: Mapping[str, np.ndarray],
             batch_size: int = 256) -> dict[str, float]:
    """Mean loss of ``forward`` (and accuracy for a loss with class labels) on ``data`` (encoded)."""
    session = instrument.session(forward)
    names = [spec.loss, *spec.outputs[:1]]
    count = batching.count(data, spec.data)
    total, correct = 0.0, 0
    labels = spec.labels
    classes = labels is not None and data[labels].dtype.kind in "iu"
    for start in range(0, count, batch_size):
        feeds = batching.take(data, spec.data, slice(start, start + batch_size))
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


def check_loss(forward: onnx.ModelProto, spec: StepSpec, batching: Batching, data: Mapping[str, np.ndarray],
               rows: int = 256) -> None:
    """That the loss the step reports is the standard loss of the trained model's own output
    (``losses.reference_loss``, on up to ``rows`` samples of ``data``, encoded): a UserError where
    they disagree. A cross-entropy taken of probabilities as if they were logits falls while the
    real cross-entropy rises."""
    if (spec.loss_kind is None or spec.labels is None  # (a standard loss has its labels)
            or batching.axis(spec.labels) != 0 or spec.labels in batching.fixed):
        return  # the reference reads samples on axis 0
    feeds = batching.take(data, spec.data, slice(0, rows))
    session = instrument.session(forward)
    with instrument.refusals("the model", "CPUExecutionProvider"):
        (output,) = session.run([spec.loss_output], feeds)
        found = reference_loss(spec.loss_kind, output, feeds[spec.labels])
        if found is None:
            return
        expected, kept = found
        (reported,) = session.run([spec.loss], batching.take(feeds, spec.data, kept))
    if not (math.isfinite(float(reported)) and math.isfinite(expected)):
        raise UserError(f"training diverged: the trained model's {spec.loss_kind} loss is {float(reported):g} "
                        f"(the updates took its weights where its outputs are no longer finite); lower --lr")
    if not math.isclose(float(reported), expected, rel_tol=LOSS_RTOL, abs_tol=LOSS_ATOL):
        raise UserError(f"the {spec.loss_kind} loss the step computes ({float(reported):.6g}) is not the "
                        f"{spec.loss_kind} of {spec.loss_output!r} ({expected:.6g} from its own values): its "
                        f"values are probabilities written in a way the loss did not recognize; pass the "
                        f"logits output as --output")
