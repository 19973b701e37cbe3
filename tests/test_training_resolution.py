"""A probability output whose logits are past float32's resolution is refused before any step,
in one line; one whose logits are ordinary trains as before."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper

from amp_rewrite.errors import UserError
from amp_rewrite.training import build
from amp_rewrite.training.preflight.resolution import MAX_SPACING
from tests.test_training_losses import _classifier, _data


def _scaled(head: str, factor: float):
    """``_classifier(head)`` with its weight multiplied by ``factor``: logits about that large."""
    model = _classifier(head)
    weight = next(t for t in model.graph.initializer if t.name == "w")
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * np.float32(factor), "w"))
    return model


def _batch(head: str) -> list[dict[str, np.ndarray]]:
    data = _data(head, 8)
    return [{"x": data["x"], "labels": data["labels"].astype(np.float32) if head == "sigmoid" else
             np.eye(3, dtype=np.float32)[data["labels"]]}]


@pytest.mark.parametrize("head, op", [("softmax", "Softmax"), ("written", "Softmax"), ("reciprocal", "Softmax"),
                                      ("sigmoid", "Sigmoid")])
def test_logits_past_float32_resolution_are_refused_in_one_line(head, op) -> None:
    with pytest.raises(UserError) as raised:
        build(_scaled(head, 1e12), loss="mse", output="out", precision="float32", range_data=_batch(head))
    message = str(raised.value)
    assert f"output 'out' is a {op} of values as large as" in message and "cannot be fine-tuned" in message
    assert "\n" not in message


@pytest.mark.parametrize("head", ["softmax", "written", "sigmoid", "logits"])
def test_ordinary_logits_and_other_outputs_build(head) -> None:
    build(_scaled(head, 1.0), loss="mse", output="out", precision="float32", range_data=_batch(head))
    if head == "logits":  # not probabilities: no bound applies, however large
        build(_scaled(head, 1e12), loss="mse", output="out", precision="float32", range_data=_batch(head))


def test_the_bound_is_where_float32_rounds_every_other_probability_to_zero() -> None:
    """At the first magnitude whose float32 spacing exceeds MAX_SPACING, two adjacent logits give
    a probability ratio float32 holds as zero; half of it still resolves a step smaller than that."""
    bound = np.float32(2.0 ** 30)
    assert np.spacing(bound) > MAX_SPACING >= np.spacing(np.float32(2.0 ** 29))
    assert np.exp(-np.float32(np.spacing(bound))) == 0.0
