"""The real-architecture models shipped in onnx (``onnx/backend/test/data/light``), made usable.

As shipped every weight is 0.02; ``randomize_weights`` gives them plausible random values.
``with_batch`` sets the batch extent of a model whose input shapes are fixed.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import onnx
from onnx import numpy_helper

LIGHT = sorted(glob.glob(os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/light/*.onnx")))


def data_input(model: onnx.ModelProto) -> onnx.ValueInfoProto:
    weights = {t.name for t in model.graph.initializer}
    return next(i for i in model.graph.input if i.name not in weights)


def feed(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    info = data_input(model)
    shape = [d.dim_value for d in info.type.tensor_type.shape.dim]
    return {info.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}


def randomize_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """Replace the constant weights (ConstantOfShape fills, or initializers) by random ones:
    He-initialised conv/matmul weights, BatchNorm scale and variance near 1, small biases."""
    rng = np.random.default_rng(seed)
    roles = {}
    for node in model.graph.node:
        if node.op_type in ("Conv", "Gemm", "MatMul") and len(node.input) > 1:
            transposed = any(a.name == "transB" and a.i for a in node.attribute)
            roles[node.input[1]] = "weight_t" if transposed else "weight"
        if node.op_type == "BatchNormalization":
            roles.update({node.input[1]: "ones", node.input[4]: "ones"})
    out = onnx.ModelProto()
    out.CopyFrom(model)
    shapes = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    fills = [n for n in out.graph.node if n.op_type == "ConstantOfShape" and n.input[0] in shapes]
    for node in fills:
        out.graph.node.remove(node)
        shape = [int(d) for d in shapes[node.input[0]]]
        out.graph.initializer.append(numpy_helper.from_array(np.zeros(shape, np.float32), node.output[0]))
        if out.ir_version < 4:  # initializers must also be graph inputs
            out.graph.input.append(onnx.helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, shape))
    for tensor in out.graph.initializer:
        if tensor.data_type != onnx.TensorProto.FLOAT:
            continue
        shape = tuple(tensor.dims)
        role = roles.get(tensor.name)
        if role in ("weight", "weight_t"):
            fan_in = int(np.prod(shape[1:])) if len(shape) > 2 or role == "weight_t" else shape[0]
            values = rng.standard_normal(shape) * np.sqrt(2.0 / max(fan_in, 1))
        elif role == "ones":
            values = 1.0 + 0.1 * np.abs(rng.standard_normal(shape))
        else:
            values = 0.01 * rng.standard_normal(shape)
        tensor.CopyFrom(numpy_helper.from_array(values.astype(np.float32), tensor.name))
    return out


def with_batch(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    """The model with ``batch`` as the first extent of its data input and outputs. Reshapes of
    activations to a constant shape that starts with the old batch (1) take the batch from their input instead
    (0 in an ONNX Reshape shape copies the input's extent); value_info, which would fix the old
    batch, is dropped."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    name = data_input(out).name
    old = data_input(out).type.tensor_type.shape.dim[0].dim_value
    weights = {t.name for t in out.graph.initializer}
    shapes = {n.input[1] for n in out.graph.node if n.op_type == "Reshape" and n.input[0] not in weights}
    for tensor in out.graph.initializer:
        if tensor.name in shapes:
            target = numpy_helper.to_array(tensor).copy()
            if target.size and target[0] == old:
                target[0] = 0
                tensor.CopyFrom(numpy_helper.from_array(target, tensor.name))
    for info in (*(i for i in out.graph.input if i.name == name), *out.graph.output):
        dims = info.type.tensor_type.shape.dim
        if dims:
            dims[0].Clear()
            dims[0].dim_value = batch
    del out.graph.value_info[:]
    return out
