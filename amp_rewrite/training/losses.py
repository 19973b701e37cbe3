"""Standard losses attached to a model output, with a new labels input.

- ``cross-entropy``: mean over samples (and positions, for ``[N, C, d...]`` outputs) of
  ``-log softmax(logits)[label]`` with integer class labels ``[N, d...]``. When the
  output is itself a Softmax, the loss reads the Softmax's input (the logits), so the
  log of a probability that rounded to zero never appears.
- ``mse``: mean of ``(output - labels)^2``, labels shaped like the output.

The loss is built in the output's element type, before the mixed-precision rewrite,
which then keeps LogSoftmax and the reductions in float32 by policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper

from amp_rewrite.errors import UserError
from amp_rewrite.ir.builder import FLOAT_TYPES, GraphBuilder, Names
from amp_rewrite.ir.opsets import default_opset
from amp_rewrite.ir.types import typed_index

LOSSES = ("cross-entropy", "mse")
LOSS_NAME = "loss"


@dataclass(frozen=True)
class AttachedLoss:
    loss: str
    labels: str
    labels_type: int
    output: str


def attach_loss(proto: onnx.ModelProto, kind: str, output: str, labels: str) -> AttachedLoss:
    """Append ``kind``'s loss on ``output`` to ``proto`` (in place), with a graph input ``labels``
    and a scalar float output ``loss``."""
    if kind not in LOSSES:
        raise UserError(f"unknown loss {kind!r}; choose one of: {', '.join(LOSSES)}")
    index = typed_index(proto)
    graph = proto.graph
    outputs = {o.name: o for o in graph.output}
    if output not in outputs:
        raise UserError(f"--output {output!r} is not an output of the model (outputs: {', '.join(outputs)})")
    value = index.values[(0, output)]
    if value.elem_type not in FLOAT_TYPES:
        raise UserError(f"--output {output!r} is not a float tensor: a {kind} loss needs one")
    taken = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {n for x in graph.node
                                                                                     for n in x.output}
    for name in (labels, LOSS_NAME):
        if name in taken:
            raise UserError(f"the model already has a value named {name!r}; choose another --labels name"
                            if name == labels else f"the model already has a value named {name!r}")
    shape = [d.dim_param or d.dim_value or None for d in outputs[output].type.tensor_type.shape.dim]
    b = GraphBuilder(Names.of_model(proto), default_opset(proto) or 17,
                     {v.name: v.elem_type for v in index.all_values() if v.elem_type})
    b.types[labels] = TensorProto.INT64 if kind == "cross-entropy" else value.elem_type
    if kind == "cross-entropy":
        if len(shape) < 2:
            raise UserError(f"a cross-entropy loss needs an output shaped [batch, classes, ...]; {output!r} has "
                            f"rank {len(shape)}")
        producer = index.producer_node(value)
        logits = producer.proto.input[0] if producer is not None and producer.op_type == "Softmax" and \
            producer.domain == "" and _softmax_over_classes(producer.proto, len(shape)) else output
        log_probs = b.op("LogSoftmax", logits, axis=1)
        picked = b.op("GatherElements", log_probs, b.axes_op("Unsqueeze", labels, [1]), axis=1)
        b.op("Neg", b.axes_op("ReduceMean", picked, None, keepdims=0), outputs=[LOSS_NAME])
        labels_shape = [shape[0], *shape[2:]]
    else:
        error = b.op("Sub", output, labels)
        b.axes_op("ReduceMean", b.op("Mul", error, error), None, keepdims=0, outputs=[LOSS_NAME])
        labels_shape = shape
    graph.node.extend(b.nodes)
    graph.input.append(helper.make_tensor_value_info(labels, b.types[labels], labels_shape))
    graph.output.append(helper.make_tensor_value_info(LOSS_NAME, value.elem_type, []))
    return AttachedLoss(LOSS_NAME, labels, b.types[labels], output)


def _softmax_over_classes(node: onnx.NodeProto, rank: int) -> bool:
    axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
    return axis % rank == 1 and rank == 2
