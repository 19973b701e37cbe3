"""Cases for softmax, losses, normalisation and (inference-mode) dropout.

Training-mode Dropout draws a random mask, so finite differences cannot check it:
``tests/test_gradients_norm.py`` checks it against the mask ONNX Runtime returns, and
checks the cases below that this table's harness cannot run (Softmax at opset 12,
GroupNormalization-18).
"""

import numpy as np

from tests.gradcases import Case, ints, normal, positive

X3 = normal(2, 3, 4)
SCORES = normal(3, 4, seed=1)
LABELS = ints([2, 0, 3])
CLASS_WEIGHTS = positive(4, seed=2)
SCORES3 = normal(2, 3, 2, seed=3)
LABELS3 = ints([[0, 2], [1, 1]])


def _bn(x: np.ndarray) -> dict:
    c = x.shape[1]
    return {"x": x, "scale": positive(c, seed=4), "B": normal(c, seed=5), "mean": normal(c, seed=6),
            "var": positive(c, seed=7)}


def _loss(op: str, scores, labels, weights=None, tag: str = "", **attrs) -> list:
    """The loss with each reduction (and, for SoftmaxCrossEntropyLoss, its log_prob output read too)."""
    inputs = {"scores": scores, "labels": labels}
    if weights is not None:
        inputs["weights"] = weights
    suffix = "".join(f"-{t}" for t in (tag, "weights" if weights is not None else "") if t)
    cases = [Case(op, inputs, {"reduction": r, **attrs}, constant=("weights",), id=r + suffix)
             for r in ("mean", "sum", "none")]
    if op == "SoftmaxCrossEntropyLoss":
        cases.append(Case(op, inputs, attrs, outputs=(0, 1), constant=("weights",), id="log-prob" + suffix))
    return cases


CASES = [
    Case("Softmax", {"x": X3}, {"axis": -1}, id="axis-last"),
    Case("Softmax", {"x": X3}, {"axis": 1}, id="axis-1-of-3d"),
    Case("Softmax", {"x": X3}, opset=21, id="opset21"),
    Case("LogSoftmax", {"x": X3}, {"axis": -1}, id="axis-last"),
    Case("LogSoftmax", {"x": X3}, {"axis": 1}, id="axis-1-of-3d"),
    *_loss("SoftmaxCrossEntropyLoss", SCORES, LABELS),
    *_loss("SoftmaxCrossEntropyLoss", SCORES, LABELS, CLASS_WEIGHTS),
    *_loss("SoftmaxCrossEntropyLoss", SCORES, ints([2, -100, 3]), tag="ignore", ignore_index=-100),
    Case("SoftmaxCrossEntropyLoss", {"scores": SCORES, "labels": ints([2, 1, 1]), "weights": CLASS_WEIGHTS},
         {"ignore_index": 1}, constant=("weights",), id="mean-ignore-in-range-weights"),
    *_loss("SoftmaxCrossEntropyLoss", SCORES3, LABELS3, tag="3d"),
    Case("SoftmaxCrossEntropyLoss", {"scores": SCORES3, "labels": ints([[0, 2], [1, 1]], np.int32)},
         {"ignore_index": 2}, id="3d-int32-labels-ignore"),
    *_loss("NegativeLogLikelihoodLoss", SCORES, LABELS),
    *_loss("NegativeLogLikelihoodLoss", SCORES, LABELS, CLASS_WEIGHTS, tag="ignore", ignore_index=0),
    *_loss("NegativeLogLikelihoodLoss", SCORES3, LABELS3, tag="3d-ignore", ignore_index=2),
    Case("BatchNormalization", _bn(normal(4, 3)), constant=("mean", "var"), id="inference-2d"),
    Case("BatchNormalization", _bn(normal(2, 3, 2, 2)), {"epsilon": 1e-3}, constant=("mean", "var"),
         id="inference-4d"),
    # a training step computes the statistics from the batch: they are differentiated too
    Case("BatchNormalization", _bn(normal(4, 3)), id="inference-2d-statistics"),
    Case("BatchNormalization", _bn(normal(2, 3, 2, 2)), {"epsilon": 1e-3}, id="inference-4d-statistics"),
    Case("BatchNormalization", _bn(normal(4, 3)), {"training_mode": 1}, constant=("mean", "var"),
         n_outputs=3, opset=15, id="training-2d"),
    Case("BatchNormalization", _bn(normal(2, 3, 2, 2)), {"training_mode": 1, "momentum": 0.8},
         constant=("mean", "var"), n_outputs=3, opset=18, id="training-4d"),
    Case("LayerNormalization", {"x": X3, "scale": positive(4), "B": normal(4, seed=1)}, id="axis-last"),
    Case("LayerNormalization", {"x": X3, "scale": positive(3, 4), "B": normal(3, 4, seed=1)}, {"axis": 1},
         opset=18, id="axis-1-of-3d"),
    Case("LayerNormalization", {"x": X3, "scale": positive(4)}, {"epsilon": 1e-3}, id="no-bias"),
    Case("LayerNormalization", {"x": X3, "scale": positive(1, 4), "B": normal(4, seed=1)}, {"axis": -2},
         id="broadcast-scale"),
    Case("InstanceNormalization", {"x": normal(2, 3, 2, 3), "scale": positive(3), "B": normal(3, seed=1)}),
    Case("InstanceNormalization", {"x": normal(2, 3, 4), "scale": positive(3), "B": normal(3, seed=1)},
         {"epsilon": 1e-3}, opset=18, id="1d"),
    # stash_type 11 (double): with the default 1 the reference computes the statistics in float32,
    # too coarse for float64 finite differences. (GroupNormalization-18, scale per group, is
    # checked in tests/test_gradients_norm.py: ONNX's checker rejects it as deprecated.)
    Case("GroupNormalization", {"x": normal(2, 4, 3), "scale": positive(4), "B": normal(4, seed=1)},
         {"num_groups": 2, "stash_type": 11}, opset=21, id="per-channel"),
    Case("Dropout", {"x": X3}, id="no-training-mode"),
    Case("Dropout", {"x": X3, "ratio": np.array(0.3), "training_mode": np.array(False)}, constant=("ratio",),
         n_outputs=2, id="training-mode-false"),
    Case("Dropout", {"x": X3, "ratio": np.array(0.0), "training_mode": np.array(True)}, constant=("ratio",),
         id="ratio-0"),
]
