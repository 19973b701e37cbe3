"""Every op a gradient graph emits has an ONNX Runtime CUDA kernel for the types it is used with
(the bundled onnxruntime-gpu 1.31.1 table), in float32 and float16 gradient graphs.

The ops verified, and so allowed in a backward pass, are listed in ``VERIFIED``; a rule
that emits anything else fails here until the op is checked and added.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest

import amp_rewrite
from amp_rewrite.inputs import samples
from amp_rewrite.ir.graph import ModelIndex
from amp_rewrite.ir.schemas import signature, type_string
from amp_rewrite.ir.types import typed_index
from amp_rewrite.policy.kernels import kernel_table
from amp_rewrite.training import gradient_model
from models import builders
from tests.gradcases import CASES, Case
from tests.gradcheck import case_model, with_loss

VERIFIED = frozenset((
    "Abs", "Add", "And", "AveragePool", "Cast", "Concat", "Constant", "ConstantOfShape", "Conv", "ConvTranspose",
    "Cos", "Div", "Equal", "Exp", "Expand", "Gather", "Gemm", "Greater", "GreaterOrEqual", "Identity", "If",
    "LayerNormalization", "Less", "LessOrEqual", "Loop", "MatMul", "Max", "Min", "Mul", "Neg", "NonZero", "Pad",
    "Pow", "Range", "Reciprocal", "ReduceMean", "ReduceSum", "Reshape", "ScatterElements", "ScatterND", "Shape",
    "Sigmoid", "Sign", "Sin", "Size", "Slice", "Softmax", "Split", "Sqrt", "Squeeze", "Sub", "Sum", "Transpose",
    "Unsqueeze", "Where",
))
"""Constant nodes need no kernel: ONNX Runtime turns them into initializers."""


def _emitted(grad: onnx.ModelProto, forward_nodes: int):
    """(index, node) for the backward nodes: after the forward at the top level, and inside their subgraphs."""
    index = typed_index(grad)
    backward = {n.id for n in index.nodes if n.graph == 0 and n.position >= forward_nodes}
    pending = list(backward)
    while pending:
        for graph_id in index.subgraphs.get(pending.pop(), ()):
            inner = [n.id for n in index.nodes if n.graph == graph_id]
            backward.update(inner)
            pending.extend(inner)
    return index, [index.nodes[i] for i in sorted(backward)]


def _unsupported(index: ModelIndex, node) -> list[str]:
    table = kernel_table("CUDAExecutionProvider")
    opset = index.opset(node)
    sig = signature(node.domain, node.op_type, opset, len(node.inputs), len(node.outputs))
    problems = []
    bound = {}
    for formal, key in [*zip(sig.inputs, node.inputs), *zip(sig.outputs, node.outputs)]:
        if key is not None and sig.is_param(formal) and index.values[key].elem_type:
            bound.setdefault(formal, index.values[key].elem_type)
    for param, elem_type in bound.items():
        name = type_string(elem_type).removeprefix("tensor(").removesuffix(")")
        if not table.supports(node.domain, node.op_type, opset, name, frozenset({param})):
            problems.append(f"{node.op_type} (opset {opset}) {param}={name}")
    return problems


@functools.cache
def _case_graphs() -> list[tuple[str, onnx.ModelProto, int]]:
    graphs = []
    for case in CASES:
        for dtype in (np.float32, np.float16):
            if dtype == np.float16 and not _runs_in_float16(case):
                continue
            model, wrt = case_model(case, dtype)
            graphs.append((f"{case.name}/{np.dtype(dtype).name}", gradient_model(model, "loss", wrt),
                           len(model.graph.node)))
    return graphs


def _runs_in_float16(case: Case) -> bool:
    """Casts to a fixed type stay as they are; every other case is rebuilt in float16."""
    return case.op not in ("Cast",)


@functools.cache
def _sample_graphs() -> list[tuple[str, onnx.ModelProto, int]]:
    graphs = []
    for name, build in sorted(builders.SAMPLES.items()):
        model = build()
        model = with_loss(model, samples.generate(model, 1, None, 0)[0])
        mixed, _ = amp_rewrite.convert(model, range_check="off")
        for label, m in (("float32", model), ("mixed", mixed)):
            graphs.append((f"{name}/{label}", gradient_model(m, "loss"), len(m.graph.node)))
    return graphs


@pytest.mark.parametrize("source", ["cases", "samples"])
def test_backward_ops_have_cuda_kernels(source):
    graphs = _case_graphs() if source == "cases" else _sample_graphs()
    unverified, unsupported = set(), []
    for label, grad, forward_nodes in graphs:
        index, nodes = _emitted(grad, forward_nodes)
        for node in nodes:
            if node.op_type == "Constant":
                continue
            if node.op_type not in VERIFIED:
                unverified.add(f"{node.op_type} (in {label})")
            unsupported += [f"{label}: {p}" for p in _unsupported(index, node)]
    assert not unverified, f"backward ops not in VERIFIED: {sorted(unverified)}"
    assert not unsupported, f"no CUDA kernel: {sorted(set(unsupported))[:20]}"


def test_verified_ops_have_float16_and_float32_cuda_kernels():
    table = kernel_table("CUDAExecutionProvider")
    for op in VERIFIED - {"And", "Not", "NonZero", "Shape", "Size", "Range", "If", "Constant"}:
        for elem in ("float", "float16"):
            assert table.supports("", op, 17, elem, frozenset()), f"{op} {elem}"
