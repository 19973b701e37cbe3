"""Standard losses attached to a model output, with a new labels input.

- ``cross-entropy``: the cross-entropy of the named output, mean over samples (and
  positions, for ``[N, C, d...]`` outputs), with integer class labels ``[N, d...]``. Where
  the output is a softmax's, in any spelling (a Softmax node, or ``Exp`` over a
  ``ReduceSum`` of it, possibly of ``x - max x``, by Div or by Mul with a Reciprocal), and
  possibly reshaped, it is ``-log p[label]`` computed as a LogSoftmax of the softmax's own
  input on its axis, reshaped as the output is: the log of a probability that rounded to zero
  never appears, nor a 1/p gradient that overflows. A LogSoftmax output is read as it is;
  any other output is taken for logits: ``-log softmax(output)[label]``. A Sigmoid's output
  gets binary cross-entropy on its input (``softplus(z) - y z``, stable for any z) with
  float labels shaped like it.
- ``mse``: mean of ``(output - labels)^2``, labels shaped like the output.

The loss is built in the output's element type, before the mixed-precision rewrite,
which then keeps LogSoftmax and the reductions in float32 by policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite.errors import UserError
from amp_rewrite.ir.builder import FLOAT_TYPES, GraphBuilder
from amp_rewrite.ir.graph import Node
from amp_rewrite.ir.opsets import default_opset
from amp_rewrite.ir.tensors import constant_tensor
from amp_rewrite.ir.types import typed_index

LOSSES = ("cross-entropy", "mse")
_RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
LOSS_NAME = "loss"
MIN_OPSET = 13
"""Where Softmax and LogSoftmax take one axis, default -1: cross-entropy's opset in ``attach_loss``."""


@dataclass(frozen=True)
class AttachedLoss:
    loss: str
    labels: str
    labels_type: int
    output: str


def attach_loss(proto: onnx.ModelProto, kind: str, output: str, labels: str) -> AttachedLoss:
    """Append ``kind``'s loss on ``output`` to ``proto`` (in place), with a graph input ``labels``
    and a scalar float output ``loss``. For cross-entropy the model must be at opset 13 or later
    (``build`` upgrades it first): before, the softmax family normalizes over every axis from
    ``axis`` on and defaults to axis 1, and the log-probabilities would need other terms."""
    if kind not in LOSSES:
        raise UserError(f"unknown loss {kind!r}; choose one of: {', '.join(LOSSES)}")
    opset = default_opset(proto)
    if kind == "cross-entropy" and (opset is None or opset < MIN_OPSET):
        raise UserError(f"a cross-entropy loss is attached at opset {MIN_OPSET} or later; the model is at opset "
                        f"{opset} (onnx.version_converter upgrades it)")
    index = typed_index(proto)
    graph = proto.graph
    outputs = {o.name: o for o in graph.output}
    if output not in outputs:
        raise UserError(f"--output {output!r} is not an output of the model (outputs: {', '.join(outputs)})")
    value = index.values[(0, output)]
    if value.elem_type not in FLOAT_TYPES:
        raise UserError(f"--output {output!r} is not a float tensor: a {kind} loss needs one")
    if value.elem_type != TensorProto.FLOAT:
        raise UserError(f"--output {output!r} is {helper.tensor_dtype_to_np_dtype(value.elem_type)}: training "
                        f"steps are built for float32 models (their weights train in float32)")
    taken = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {n for x in graph.node
                                                                                     for n in x.output}
    if labels in taken:
        raise UserError(f"the model already has a value named {labels!r}; choose another --labels name")
    loss_name = next(name for name in (LOSS_NAME, *(f"{LOSS_NAME}_{i}" for i in range(1, len(taken) + 2)))
                     if name not in taken)
    shape = [d.dim_param or d.dim_value or None for d in outputs[output].type.tensor_type.shape.dim]
    b = GraphBuilder.for_index(index)
    sigmoid = _behind(index, value, "Sigmoid") if kind == "cross-entropy" else None
    b.types[labels] = TensorProto.INT64 if kind == "cross-entropy" and sigmoid is None else value.elem_type
    if sigmoid is not None:  # binary cross-entropy on the Sigmoid's input z: relu(z) - y z + softplus(-|z|)
        logits = _reshaped_as(b, sigmoid[0].proto.input[0], sigmoid[1])
        stable = b.op("Add", b.op("Sub", b.op("Relu", logits), b.op("Mul", logits, labels)),
                      b.op("Softplus", b.op("Neg", b.op("Abs", logits))))
        b.axes_op("ReduceMean", stable, None, keepdims=0, outputs=[loss_name])
        labels_shape = shape
    elif kind == "cross-entropy":
        if len(shape) < 2:
            raise UserError(f"a cross-entropy loss needs an output shaped [batch, classes, ...]; {output!r} has "
                            f"rank {len(shape)}")
        found = _softmax_input(index, value)
        if found is not None:  # log(probabilities) from the softmax's own input, then the same reshapes
            logits, axis, reshapes = found
            log_probs = _reshaped_as(b, b.op("LogSoftmax", logits, axis=axis), reshapes)
        elif _behind(index, value, "LogSoftmax") is not None:
            log_probs = output
        else:
            log_probs = b.op("LogSoftmax", output, axis=1)
        picked = b.op("GatherElements", log_probs, b.axes_op("Unsqueeze", labels, [1]), axis=1)
        b.op("Neg", b.axes_op("ReduceMean", picked, None, keepdims=0), outputs=[loss_name])
        labels_shape = [shape[0], *shape[2:]]
    else:
        error = b.op("Sub", output, labels)
        b.axes_op("ReduceMean", b.op("Mul", error, error), None, keepdims=0, outputs=[loss_name])
        labels_shape = shape
    graph.node.extend(b.nodes)
    graph.input.append(helper.make_tensor_value_info(labels, b.types[labels], labels_shape))
    graph.output.append(helper.make_tensor_value_info(loss_name, value.elem_type, []))
    return AttachedLoss(loss_name, labels, b.types[labels], output)


def probability_input(index, value) -> tuple[str, str] | None:
    """Where ``value`` (possibly None) holds probabilities: ("Softmax", its input) for a softmax in
    any spelling, ("Sigmoid", its input) for a sigmoid, possibly reshaped after; None otherwise."""
    if value is None:
        return None
    found = _softmax_input(index, value)
    if found is not None:
        return "Softmax", found[0]
    sigmoid = _behind(index, value, "Sigmoid")
    return None if sigmoid is None else ("Sigmoid", sigmoid[0].proto.input[0])


def _behind(index, value, op_type: str) -> tuple[Node, list[Node]] | None:
    """(the ``op_type`` node the value comes from, the reshapes between them, first to last), or None."""
    chain = []
    node = index.producer_node(value)
    while node is not None and node.domain == "" and node.op_type in _RESHAPES:
        chain.append(node)
        node = index.producer_node(index.values[node.inputs[0]])
    if node is None or node.domain != "" or node.op_type != op_type:
        return None
    return node, list(reversed(chain))


def _softmax_input(index, value) -> tuple[str, int, list[Node]] | None:
    """Where ``value`` is a softmax's output, in any spelling, and possibly reshaped: (the
    softmax's input, its axis, the reshapes after it); None otherwise. Spellings: a Softmax
    node; ``e / ReduceSum(e, axis)`` or ``e * Reciprocal(ReduceSum(e, axis))`` with ``e = Exp(z)``
    (z often ``x - ReduceMax(x)``, whose log-softmax is x's)."""
    found = _behind(index, value, "Softmax")
    if found is not None:
        softmax, reshapes = found
        return softmax.proto.input[0], next((a.i for a in softmax.proto.attribute if a.name == "axis"), -1), reshapes
    for op_type in ("Div", "Mul"):
        found = _behind(index, value, op_type)
        if found is None:
            continue
        node, reshapes = found
        exp, total = (index.producer_node(index.values[key]) if key else None for key in node.inputs[:2])
        if op_type == "Mul" and total is not None and total.op_type == "Reciprocal":
            total = index.producer_node(index.values[total.inputs[0]])
        if exp is None or total is None or exp.op_type != "Exp" or total.op_type != "ReduceSum" or \
                total.inputs[0] != exp.outputs[0]:
            continue
        axes = _reduce_axes(index, total)
        if axes is not None and len(axes) == 1 and _keeps_dims(total):
            return exp.proto.input[0], axes[0], reshapes
    return None


def _reduce_axes(index, node: Node) -> list[int] | None:
    """A ReduceSum's axes, from its attribute (opset < 13) or its constant second input."""
    attribute = next((list(a.ints) for a in node.proto.attribute if a.name == "axes"), None)
    if attribute is not None:
        return attribute
    if len(node.inputs) < 2 or node.inputs[1] is None:
        return None
    tensor = index.initializers.get(node.inputs[1])
    producer = index.producer_node(index.values[node.inputs[1]])
    if tensor is None and producer is not None and producer.op_type == "Constant":
        tensor = constant_tensor(producer.proto)
    return None if tensor is None else [int(a) for a in numpy_helper.to_array(tensor).reshape(-1)]


def _keeps_dims(node: Node) -> bool:
    return next((a.i for a in node.proto.attribute if a.name == "keepdims"), 1) == 1


def _reshaped_as(b: GraphBuilder, value: str, reshapes: list[Node]) -> str:
    """``value`` through the same reshapes (their other inputs and attributes) as the output."""
    for node in reshapes:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.proto.attribute}
        value = b.op(node.op_type, value, *node.proto.input[1:], **attributes)
    return value


def reference_loss(kind: str, output: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray] | None:
    """The ``kind`` loss of ``output`` (the model's own values) against ``labels``, in float64
    from the values alone, over the samples where that can be read exactly: (the loss, those
    samples' indices), or None where none can. Cross-entropy reads an output whose rows are
    non-negative and sum to one as probabilities (``-log p``; samples whose picked probability is
    below PROBABILITY_FLOOR left out: float32 holds too few digits of a log there) and any other as
    logits; float labels mean a binary cross-entropy of probabilities. What ``attach_loss`` builds
    must agree with it (``Trainer.check_loss``)."""
    out, rows = output.astype(np.float64), np.arange(len(output))
    if kind == "mse":
        return float(np.mean((out - labels) ** 2)), rows
    if labels.dtype.kind == "f":  # a sigmoid's probabilities
        keep = np.all((out >= PROBABILITY_FLOOR) & (out <= 1 - PROBABILITY_FLOOR), axis=tuple(range(1, out.ndim)))
        p, y = out[keep], labels[keep].astype(np.float64)
        return (float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p))), rows[keep]) if keep.any() else None
    if np.all(out >= 0) and np.allclose(out.sum(axis=1), 1.0, atol=1e-3):
        picked = np.take_along_axis(out, labels[:, None].astype(np.int64), axis=1)[:, 0]
        keep = np.all(picked >= PROBABILITY_FLOOR, axis=tuple(range(1, picked.ndim)))
        return (float(-np.mean(np.log(picked[keep]))), rows[keep]) if keep.any() else None
    shifted = out - out.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(-np.mean(np.take_along_axis(log_probs, labels[:, None].astype(np.int64), axis=1))), rows


PROBABILITY_FLOOR = 1e-4
"""Below this a float32 probability's log is read from too few digits to check a loss against."""
