"""ChooseMinCasts is optimal: checked against brute force on small random graphs."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite import ConvertOptions
from amp_rewrite.ir.graph import ModelIndex
from amp_rewrite.ir.sizes import ValueSizes
from amp_rewrite.rewrite.analysis import Analysis
from amp_rewrite.rewrite.coloring import Color
from amp_rewrite.rewrite.passes import ANALYSIS, ChooseMinCasts
from amp_rewrite.rewrite.passes.choose_min_casts import cast_bytes

OPS = ["MatMul", "Relu", "Add", "Transpose", "Exp", "Concat", "ReduceMax", "Tanh"]


@st.composite
def random_models(draw) -> onnx.ModelProto:
    """Up to nine nodes over float tensors of varying widths, with several graph outputs."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    values = [("x", 4)]
    nodes, inits = [], []
    for i in range(draw(st.integers(2, 9))):
        op = draw(st.sampled_from(OPS))
        src, width = values[draw(st.integers(0, len(values) - 1))]
        out = f"v{i}"
        if op == "MatMul":
            new_width = draw(st.sampled_from([2, 4, 16]))
            inits.append(numpy_helper.from_array(rng.standard_normal((width, new_width)).astype(np.float32), f"w{i}"))
            nodes.append(helper.make_node(op, [src, f"w{i}"], [out], name=f"n{i}"))
            width = new_width
        elif op in ("Add", "Concat"):
            other = [v for v in values if v[1] == width]
            partner = other[draw(st.integers(0, len(other) - 1))][0]
            attrs = {"axis": -1} if op == "Concat" else {}
            nodes.append(helper.make_node(op, [src, partner], [out], name=f"n{i}", **attrs))
            width = width * 2 if op == "Concat" else width
        elif op == "Transpose":
            nodes.append(helper.make_node(op, [src], [out], name=f"n{i}", perm=[0, 1]))
        elif op == "ReduceMax":
            nodes.append(helper.make_node(op, [src], [out], name=f"n{i}", axes=[-1], keepdims=1))
            width = 1
        else:
            nodes.append(helper.make_node(op, [src], [out], name=f"n{i}"))
        values.append((out, width))
    outputs = [helper.make_tensor_value_info(v, TensorProto.FLOAT, [2, w]) for v, w in values[1:]
               if draw(st.booleans()) or v == values[-1][0]]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def _analysis_before_min_cut(model: onnx.ModelProto, keep_io_types: bool) -> Analysis:
    options = ConvertOptions(provider=None, range_check="off", keep_io_types=keep_io_types).validated()
    analysis = Analysis(ModelIndex(model), options)
    for step in ANALYSIS:
        if step is not ChooseMinCasts:
            step().run(analysis)
    return analysis


@settings(max_examples=150, deadline=None)
@given(random_models(), st.booleans())
def test_min_cut_matches_brute_force(model: onnx.ModelProto, keep_io_types: bool) -> None:
    analysis = _analysis_before_min_cut(model, keep_io_types)
    free = set(analysis.coloring.free_nodes())
    sizes = ValueSizes(analysis.index)
    values = [v for v in analysis.index.all_values() if analysis.is_float(v)]
    best = min(
        (cast_bytes(analysis, sizes, values, dict(zip(sorted(free), combo)), free),
         sum(c is Color.FP32 for c in combo))
        for combo in itertools.product((Color.LOW, Color.FP32), repeat=len(free))
    )
    ChooseMinCasts().run(analysis)
    chosen = {n: analysis.coloring.color(n) for n in free}
    assert all(analysis.coloring.decisions[n].reason for n in free)
    got = (cast_bytes(analysis, sizes, values, chosen, free), sum(c is Color.FP32 for c in chosen.values()))
    assert got == best


def test_sizes_come_from_shape_inference_when_the_model_declares_none() -> None:
    from models import builders

    model = builders.transformer(blocks=1, width=32)
    index = ModelIndex(model)
    sizes = ValueSizes(index)
    scores = next(v for v in index.all_values() if v.producer and index.nodes[v.producer[0]].op_type == "Softmax")
    hidden = next(v for v in index.all_values() if v.producer and index.nodes[v.producer[0]].op_type == "Erf")
    assert scores.shape is None and hidden.shape is None
    # batch and seq are symbolic (64 each): scores [b, 4, s, s], FFN hidden [b, s, 128]
    assert sizes.elements(scores) == 64 * 4 * 64 * 64
    assert sizes.elements(hidden) == 64 * 64 * 128
