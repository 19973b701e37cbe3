"""Models whose floats are not float32 train through their float32 view.

A model exported in float16 (or bfloat16, or float64 as scikit-learn's converters write a
double-precision regressor), or one a converter already made mixed, has no float32 master
weights to train. ``lower`` rewrites such a model, in place, into the same graph with every
float type float32: initializers and Constant / ConstantOfShape values, Cast targets and the
ops' ``dtype`` attributes, and the declared types of inputs, outputs and intermediate values,
in subgraphs too. The step is then built from the view as from any float32 model (the mixed
rewrite chooses float16 again where it pays), and ``write_back`` writes each trained weight
back into the original model in its own type.

Invariant: after ``lower``, the graph holds no float type but float32; a float64 value that
float32 cannot hold (beyond its range) is refused, never turned into an infinity.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from amp_rewrite.errors import UserError
from amp_rewrite.ir.builder import FLOAT_TYPES

OTHER_FLOATS = FLOAT_TYPES - {TensorProto.FLOAT}
"""The float types a view replaces."""

TYPE_ATTRIBUTES = {"Cast": "to", "EyeLike": "dtype", "RandomNormal": "dtype", "RandomUniform": "dtype",
                   "RandomNormalLike": "dtype", "RandomUniformLike": "dtype", "Bernoulli": "dtype"}
"""Standard ops whose attribute names the type of their output."""


def lower(model: onnx.ModelProto) -> None:
    """Make every float type of ``model`` float32, in place (see the module's docstring)."""
    _view_graph(model.graph)


def write_back(model: onnx.ModelProto, weights: Mapping[str, np.ndarray]) -> None:
    """Put ``weights`` (by name) into the initializers of ``model`` that hold them, in place, each
    in its tensor's own type (float16, bfloat16 or float64 where the model is not the view)."""
    for tensor in model.graph.initializer:
        if tensor.name in weights:
            trained = weights[tensor.name].astype(numpy_helper.to_array(tensor).dtype)
            tensor.CopyFrom(numpy_helper.from_array(trained, tensor.name))


def as_float32(array: np.ndarray) -> np.ndarray:
    """``array`` in float32 where it is a float array (the view's inputs), else as it is."""
    array = np.asarray(array)
    return array.astype(np.float32, copy=False) if np.issubdtype(array.dtype, np.floating) else array


def _subgraphs(attribute: onnx.AttributeProto) -> list[onnx.GraphProto]:
    if attribute.type == onnx.AttributeProto.GRAPH:
        return [attribute.g]
    return list(attribute.graphs) if attribute.type == onnx.AttributeProto.GRAPHS else []


def _view_graph(graph: onnx.GraphProto) -> None:
    for tensor in graph.initializer:
        _view_tensor(tensor)
    for info in (*graph.input, *graph.output, *graph.value_info):
        if info.type.tensor_type.elem_type in OTHER_FLOATS:
            info.type.tensor_type.elem_type = TensorProto.FLOAT
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.name == TYPE_ATTRIBUTES.get(node.op_type) and attribute.i in OTHER_FLOATS:
                attribute.i = TensorProto.FLOAT
            elif attribute.type == onnx.AttributeProto.TENSOR:
                _view_tensor(attribute.t)
            for sub in _subgraphs(attribute):
                _view_graph(sub)


def _view_tensor(tensor: onnx.TensorProto) -> None:
    """``tensor`` in float32, in place, where it is another float type."""
    if tensor.data_type not in OTHER_FLOATS:
        return
    values = numpy_helper.to_array(tensor).astype(np.float64)
    if np.any(np.abs(values[np.isfinite(values)]) > np.finfo(np.float32).max):
        raise UserError(f"tensor {tensor.name!r} holds values beyond float32's range: the model trains in its "
                        f"float32 view, which cannot hold them")
    tensor.CopyFrom(numpy_helper.from_array(values.astype(np.float32), tensor.name))
