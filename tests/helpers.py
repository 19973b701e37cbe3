"""A tiny graph helper: build models from ONNX text, read back colors and casts."""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import onnx
import onnx.parser
from onnx import TensorProto, numpy_helper

from tests.reference_ops import evaluator

LOW_TYPES = {TensorProto.FLOAT16: "low", TensorProto.BFLOAT16: "low", TensorProto.FLOAT: "fp32"}


def model(text: str, initializers: dict[str, np.ndarray] | None = None, opset: int = 17) -> onnx.ModelProto:
    """A model from the body of an ONNX text graph, e.g.
    ``model("(float[2,4] x) => (float[2,4] y) { y = Relu(x) }")``."""
    m = onnx.parser.parse_model(f'<ir_version: 8, opset_import: ["" : {opset}]>\nagraph {text}')
    for name, array in (initializers or {}).items():
        m.graph.initializer.append(numpy_helper.from_array(np.asarray(array), name))
    onnx.checker.check_model(m, full_check=True)
    return m


def rms_norm(i: int, x: str, y: str, eps: float = 1e-6) -> str:
    """ONNX text of a Llama-style RMSNorm of ``x`` into ``y`` as exporters write it (its epsilon
    a Constant node, the weight ``w``), its nodes named ``square{i}``, ``mean{i}``, ``eps_add{i}``..."""
    return f"""
      two{i} = Constant<value = float {{2.0}}>()
      eps{i} = Constant<value = float {{{eps!r}}}>()
      one{i} = Constant<value = float {{1.0}}>()
      [square{i}] p{i} = Pow({x}, two{i})
      [mean{i}] m{i} = ReduceMean<axes=[-1]>(p{i})
      [eps_add{i}] a{i} = Add(m{i}, eps{i})
      [sqrt{i}] s{i} = Sqrt(a{i})
      [inverse{i}] r{i} = Div(one{i}, s{i})
      [scale{i}] n{i} = Mul({x}, r{i})
      [weight{i}] {y} = Mul(w, n{i})"""


def colors(converted: onnx.ModelProto) -> dict[str, str]:
    """'low' or 'fp32' for each named non-Cast node (``[name] out = Op(...)`` in ONNX
    text), from the strictly inferred type of its first output."""
    inferred = onnx.shape_inference.infer_shapes(converted, strict_mode=True)
    types = {v.name: v.type.tensor_type.elem_type
             for v in (*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input)}
    return {n.name: LOW_TYPES.get(types.get(n.output[0]), "other")
            for n in converted.graph.node if n.name and n.op_type != "Cast"}


def cast_count(converted: onnx.ModelProto) -> int:
    return sum(n.op_type == "Cast" for g in _graphs(converted.graph) for n in g.node)


def cast_targets(converted: onnx.ModelProto) -> Counter:
    """How many Cast nodes read each tensor, per target type."""
    return Counter((n.input[0], n.attribute[0].i) for g in _graphs(converted.graph) for n in g.node
                   if n.op_type == "Cast")


def run(m: onnx.ModelProto, **feeds: np.ndarray) -> list[np.ndarray]:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return evaluator(m).run(None, feeds)


def optimized(m: onnx.ModelProto, folder) -> onnx.ModelProto:
    """The model ONNX Runtime runs for ``m`` on the CPU at its default (all) graph optimizations,
    written to ``folder`` and read back."""
    from amp_rewrite.runtime import instrument

    path = folder / "optimized.onnx"
    instrument.session(m, optimize="all", save_optimized=path)
    return onnx.load(path)


def _graphs(graph: onnx.GraphProto):
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _graphs(sub)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)
