"""Standard losses attached to a model output, with a new labels input.

- ``cross-entropy``: mean over samples (and positions, for ``[N, C, d...]`` outputs) of
  ``-log softmax(logits)[label]`` with integer class labels ``[N, d...]``. When the
  output is a Softmax's (possibly reshaped), the log-probabilities are a LogSoftmax of
  the Softmax's own input on its axis, reshaped as the output is: the log of a
  probability that rounded to zero never appears, nor a 1/p gradient that overflows.
- ``mse``: mean of ``(output - labels)^2``, labels shaped like the output.

The loss is built in the output's element type, before the mixed-precision rewrite,
which then keeps LogSoftmax and the reductions in float32 by policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper

from amp_rewrite.errors import UserError
from amp_rewrite.ir.builder import FLOAT_TYPES, GraphBuilder
from amp_rewrite.ir.opsets import default_opset
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
    b.types[labels] = TensorProto.INT64 if kind == "cross-entropy" else value.elem_type
    if kind == "cross-entropy":
        if len(shape) < 2:
            raise UserError(f"a cross-entropy loss needs an output shaped [batch, classes, ...]; {output!r} has "
                            f"rank {len(shape)}")
        chain = _softmax_behind(index, value)
        if chain:  # log(probabilities) from the Softmax's own input, then the same reshapes
            softmax, *reshapes = chain
            axis = next((a.i for a in softmax.proto.attribute if a.name == "axis"), -1)
            log_probs = b.op("LogSoftmax", softmax.proto.input[0], axis=axis)
            for node in reshapes:
                attributes = {a.name: helper.get_attribute_value(a) for a in node.proto.attribute}
                log_probs = b.op(node.op_type, log_probs, *node.proto.input[1:], **attributes)
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


def _softmax_behind(index, value) -> list:
    """[the Softmax the value comes from, then the reshapes between them], or [] when it is no
    Softmax's output."""
    chain = []
    node = index.producer_node(value)
    while node is not None and node.domain == "" and node.op_type in _RESHAPES:
        chain.append(node)
        node = index.producer_node(index.values[node.inputs[0]])
    if node is None or node.domain != "" or node.op_type != "Softmax":
        return []
    return [node, *reversed(chain)]
