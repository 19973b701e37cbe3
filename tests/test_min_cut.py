"""The minimum cut agrees with networkx's on random networks, and ChooseMinCasts is optimal:
checked against brute force on small random graphs."""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite import ConvertOptions
from amp_rewrite.ir.graph import ModelIndex
from amp_rewrite.ir.sizes import ValueSizes
from amp_rewrite.rewrite.analysis import Analysis
from amp_rewrite.rewrite.coloring import Color
from amp_rewrite.rewrite.min_cut import INFINITE, min_cut
from amp_rewrite.rewrite.passes import ChooseMinCasts
from amp_rewrite.rewrite.passes.choose_min_casts import cast_bytes
from amp_rewrite.rewrite.pipeline import analysis_passes

CAPACITIES = st.one_of(st.integers(0, 20), st.integers(2**40, 2**70), st.just(INFINITE))
"""Small ones for ties and zero edges, byte counts beyond 32 (and 64) bits, and infinite edges."""


@st.composite
def networks(draw) -> tuple[int, list]:
    """Up to ten nodes (0 the source, 1 the sink) and up to thirty edges, parallel ones and loops included."""
    size = draw(st.integers(2, 10))
    nodes = st.integers(0, size - 1)
    edges = draw(st.lists(st.tuples(nodes, nodes, CAPACITIES), max_size=30))
    return size, edges


def _networkx_graph(size: int, edges: list) -> nx.DiGraph:
    """The network for networkx, which keeps one edge per pair: parallel capacities added up."""
    total: dict[tuple[int, int], int | None] = {}
    for tail, head, capacity in edges:
        old = total.get((tail, head), 0)
        total[tail, head] = None if capacity is None or old is None else old + capacity
    graph = nx.DiGraph()
    graph.add_nodes_from(range(size))
    graph.add_edges_from((t, h, {} if c is None else {"capacity": c}) for (t, h), c in total.items())
    return graph


@settings(max_examples=400, deadline=None)
@given(networks())
def test_min_cut_is_networkx_cut(network: tuple[int, list]) -> None:
    """Same value and same source side: the nodes that do not reach the sink in the residual graph."""
    size, edges = network
    try:
        expected, (source_side, _) = nx.minimum_cut(_networkx_graph(size, edges), 0, 1)
    except nx.NetworkXUnbounded:
        with pytest.raises(ValueError, match="infinite edge"):
            min_cut(size, edges, 0, 1)
        return
    value, side = min_cut(size, edges, 0, 1)
    assert value == expected
    assert {n for n in range(size) if side[n]} == source_side
    assert value == sum(c for t, h, c in edges if side[t] and not side[h])  # the flow fills the cut


def test_min_cut_of_a_comb_is_the_largest_source_side() -> None:
    """A chain into the sink, fed from the source at its head and at every link, the feeds adding
    up to the sink's edge: cutting the source off and cutting the sink off cost the same, and the
    source side returned is the largest (the whole chain). Augmenting paths would carry each
    feed down the chain on its own (time quadratic in its length); push-relabel merges them."""
    n = 2000
    head = 2**45
    edges = [(0, 2, head), *((i, i + 1, 2**50) for i in range(2, n)), (n, 1, head + n - 2)]
    edges += [(0, i, 1) for i in range(3, n + 1)]
    value, side = min_cut(n + 1, edges, 0, 1)
    assert value == head + n - 2
    assert side == [True, False, *[True] * (n - 1)]


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
    for step in analysis_passes(options):
        if not isinstance(step, ChooseMinCasts):
            step.run(analysis)
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


def test_sizes_inside_subgraphs_come_from_shape_inference() -> None:
    """Values that only If branches define (nested ones too) get the shapes inferred in their own branch."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    def concat(axis: int) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node("Concat", ["x", "x"], ["joined"], axis=axis),
                                  helper.make_node("Neg", ["joined"], ["inner_out"])], f"concat{axis}", [],
                                 [helper.make_tensor_value_info("inner_out", TensorProto.FLOAT, None)])

    then = helper.make_graph([helper.make_node("If", ["c"], ["nested"], then_branch=concat(1), else_branch=concat(0)),
                              helper.make_node("Relu", ["nested"], ["then_out"])], "then", [],
                             [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Transpose", ["x"], ["tall"]),
                               helper.make_node("Neg", ["tall"], ["else_out"])], "else", [],
                              [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, None)])
    graph = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "g",
                              [x, cond], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    index = ModelIndex(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    sizes = ValueSizes(index)
    shapes = {(v.key[0], v.name): sizes.shape(v) for v in index.all_values() if v.key[0]}
    assert len(shapes.pop((2, "nested"))) == len(shapes.pop((2, "then_out"))) == 2  # branches disagree: rank only
    assert shapes == {(1, "tall"): (3, 2), (1, "else_out"): (3, 2),  # else_branch sorts before then_branch
                      (3, "joined"): (4, 3), (3, "inner_out"): (4, 3), (4, "joined"): (2, 6), (4, "inner_out"): (2, 6)}
