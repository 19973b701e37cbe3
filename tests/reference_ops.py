"""onnx's reference evaluator with the ops it gets wrong replaced (onnx 1.23.2).

Three of its ops compute something other than the spec where real models use them, and a
test whose float32 reference runs through them compares against a different function:

- ``LRN`` loops over the batch dimension where the spec sums over channels: with batch 1,
  every channel but the first is divided by ``bias ** beta`` alone (AlexNet, ZFNet-512 and
  Inception-v1 of onnx's light models, off by up to 22% in one node).
- ``BatchNormalization`` at opsets 7-13 mixes the batch's own statistics into the running
  ones (the attribute ``momentum`` always has its default, which turns that on), where a
  node with one output normalizes with the running statistics (inference).
- ``Softmax``, ``LogSoftmax`` and ``Hardmax`` before opset 13 use opset 13's semantics:
  the default axis -1, and the reduction over that axis alone, where the input is coerced
  to 2-D at ``axis`` (default 1) and reduced over every axis from it on.

ONNX Runtime follows the spec on all of them (tests/test_reference_ops.py).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun
from onnx.reference.ops.op_batch_normalization import (
    BatchNormalization_6,
    BatchNormalization_9,
    BatchNormalization_14,
)
from onnx.reference.ops.op_hardmax import Hardmax
from onnx.reference.ops.op_softmax import Softmax


def _opset(op: OpRun) -> int:
    return op.run_params["opsets"].get("", onnx.defs.onnx_opset_version())


class LRN(OpRun):
    op_domain = ""

    def _run(self, x, alpha=None, beta=None, bias=None, size=None):
        squares = np.square(x.astype(np.float64))
        below, above = (size - 1) // 2, math.ceil((size - 1) / 2)
        window = np.zeros_like(squares)
        for c in range(x.shape[1]):
            window[:, c] = squares[:, max(0, c - below):c + above + 1].sum(axis=1)
        return ((x / (bias + alpha / size * window) ** beta).astype(x.dtype),)


class BatchNormalization(OpRun):
    op_domain = ""

    def _run(self, x, scale, bias, mean, var, epsilon=None, momentum=None, training_mode=None, spatial=1,
             is_test=None, consumed_inputs=None):
        opset = _opset(self)
        if opset >= 14:
            return BatchNormalization_14._run(self, x, scale, bias, mean, var, epsilon, momentum, training_mode)
        if opset < 7:
            return BatchNormalization_6._run(self, x, scale, bias, mean, var, epsilon, is_test, momentum, spatial)
        if sum(1 for name in self.onnx_node.output if name) > 1:  # training: the outputs after Y asked for
            return BatchNormalization_9._run(self, x, scale, bias, mean, var, epsilon, momentum)
        # statistics per channel, or (opsets 7-8, spatial=0) per element of a sample
        shape = (1, -1) + (1,) * (x.ndim - 2) if spatial else (1, *scale.shape)
        y = scale.reshape(shape) * (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + epsilon)
        return ((y + bias.reshape(shape)).astype(x.dtype),)


def _coerced(base: type, log: bool = False) -> type:
    """``base`` (Softmax or Hardmax) with the semantics of its versions before 13."""

    def _run(self, x, axis=None):
        if _opset(self) >= 13:
            y = base._run(self, x, axis=self.axis)[0]
        else:
            given = next((a.i for a in self.onnx_node.attribute if a.name == "axis"), 1)
            given += x.ndim if given < 0 else 0
            flat = x.reshape(math.prod(x.shape[:given]), -1)
            y = base._run(self, flat, axis=1)[0].reshape(x.shape)
        return (np.log(y) if log else y,)

    name = "LogSoftmax" if log else base.__name__
    return type(name, (base,), {"op_domain": "", "_run": _run})


CORRECTED = [LRN, BatchNormalization, _coerced(Softmax), _coerced(Softmax, log=True), _coerced(Hardmax)]
"""The evaluator's ops that ``evaluator`` replaces."""


def evaluator(model: onnx.ModelProto, new_ops: list[type] | None = None) -> ReferenceEvaluator:
    """onnx's reference evaluator over ``model`` with the ``CORRECTED`` ops (and ``new_ops``)."""
    return ReferenceEvaluator(model, new_ops=[*CORRECTED, *(new_ops or ())])
