"""A model specialized to fixed input extents, its shape computations folded to constants.

Exporters compute shapes at run time: a decoder's Resize takes sizes from ``Shape(x)``, a Pad
its pads from a Concat of extents, a Reshape a target that makes ranks unknown. Where the data
fixes every input extent (training data has one shape), ``specialized`` declares the inputs at
those extents, infers every shape, and evaluates (onnx's reference evaluator) each top-level
node whose inputs are then all known: a Shape or Size of a value whose shape is static, a
Constant, and nodes of known inputs, never a ``keep`` value (the trained weights) nor what
depends on one. The folded values become initializers; the rest of the graph is unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from amp_rewrite.errors import UserError
from amp_rewrite.ir.sizes import iter_graphs
from amp_rewrite.ir.tensors import constant_tensor

MOST_FOLDED = 1 << 16
"""The most elements a folded value may hold: a larger one is computed at run time as before."""
KNOWN_ELEMENTS = 1 << 12
"""Initializers up to this many elements are known to the folding (shape operands, scales); larger
ones are weights, which no shape computation reads."""
RANDOM_OPS = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
                        "Bernoulli"})
"""Ops whose outputs differ from run to run."""
_NEVER = RANDOM_OPS | {"Dropout", "If", "Loop", "Scan", "SequenceConstruct", "SequenceEmpty"}
"""Ops not folded: random ones, Dropout (random in the step), and those with subgraphs or sequences."""


def specialized(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], keep: set[str],
                observed: Mapping[str, tuple[tuple[int, ...], np.dtype]] | None = None) -> onnx.ModelProto:
    """A copy of ``model`` with the graph inputs of ``shapes`` declared at those extents and its
    top-level shape computations folded (the module's docstring); ``keep``: values never folded.
    ``observed``: value name -> (shape, dtype) seen on a run at those extents, declared where
    onnx's inference finds no static shape (ops it has no inference for: ``ai.onnx.ml``,
    contributed ops)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    for info in graph.input:
        if info.name in shapes:
            dims = info.type.tensor_type.shape
            dims.ClearField("dim")
            for extent in shapes[info.name]:
                dims.dim.add(dim_value=int(extent))
    del graph.value_info[:]
    try:
        inferred = onnx.shape_inference.infer_shapes(copy, data_prop=True).graph
    except Exception as exc:  # the extents contradict the model: its own error says where
        raise UserError(f"the model cannot take the data's extents: {str(exc).splitlines()[0][:200]}") from None
    static = {v.name: _static(v) for v in (*inferred.input, *inferred.value_info, *inferred.output)}
    seen = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), list(shape))
            for name, (shape, dtype) in (observed or {}).items() if static.get(name) is None]
    inferred.value_info.extend(seen)
    static.update((v.name, _static(v)) for v in seen)
    known = {t.name: numpy_helper.to_array(t) for t in graph.initializer
             if t.name not in keep and math.prod(t.dims) <= KNOWN_ELEMENTS}
    folded: dict[str, np.ndarray] = {}
    kept_nodes = []
    for node in graph.node:
        values = _fold(node, known, static, copy.opset_import)
        if values is None:
            kept_nodes.append(node)
            continue
        known.update(values)
        folded.update(values)
    if folded:
        read = {name for g in iter_graphs(graph) for n in g.node for name in n.input} | {o.name for o in graph.output}
        del graph.node[:]
        graph.node.extend(kept_nodes)
        graph.initializer.extend(numpy_helper.from_array(array, name) for name, array in folded.items()
                                 if name in read and name not in {t.name for t in graph.initializer})
    graph.value_info.extend(v for v in inferred.value_info if v.name not in folded)
    return copy


def _fold(node: onnx.NodeProto, known: Mapping[str, np.ndarray], static: Mapping[str, tuple | None],
          opsets) -> dict[str, np.ndarray] | None:
    """The node's outputs where it can be folded, else None."""
    if node.domain not in ("", "ai.onnx") or node.op_type in _NEVER:
        return None
    if node.op_type == "Constant":
        tensor = constant_tensor(node)
        return None if tensor is None else {node.output[0]: numpy_helper.to_array(tensor)}
    if node.op_type in ("Shape", "Size") and static.get(node.input[0]) is not None:
        shape = np.array(static[node.input[0]], np.int64)
        if node.op_type == "Size":
            return {node.output[0]: np.array(shape.prod(), np.int64)}
        attrs = {a.name: a.i for a in node.attribute}
        start, end = attrs.get("start", 0), attrs.get("end", len(shape))
        return {node.output[0]: shape[start:end]}
    if not node.input or not all(not name or name in known for name in node.input):
        return None
    return _evaluated(node, known, opsets)


def _evaluated(node: onnx.NodeProto, known: Mapping[str, np.ndarray], opsets) -> dict[str, np.ndarray] | None:
    from onnx.reference import ReferenceEvaluator

    inputs = [name for name in node.input if name]
    graph = helper.make_graph([node], "fold", [helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(known[name].dtype), known[name].shape) for name in inputs],
        [helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None) for name in node.output if name])
    try:
        results = ReferenceEvaluator(helper.make_model(graph, opset_imports=opsets)).run(
            None, {name: known[name] for name in inputs})
    except Exception:  # an op the evaluator lacks, or one that does not run on these: computed at run time
        return None
    outputs = [name for name in node.output if name]
    if any(not isinstance(r, np.ndarray) or r.size > MOST_FOLDED for r in results):
        return None
    return dict(zip(outputs, results))


def _static(info: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    tensor = info.type.tensor_type if info.type.HasField("tensor_type") else None
    if tensor is None or not tensor.HasField("shape"):
        return None
    dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
    return None if any(d < 0 for d in dims) else dims
