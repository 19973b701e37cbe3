"""Declared shapes that onnx's inference contradicts (exporters write some wrong) are dropped, or
corrected, on the copy that gradients are built on: a rule that reads a declared rank of 2 for
a value the runtime makes at rank 3 built a Gemm that ONNX Runtime refused."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite.cli import main
from amp_rewrite.ir import declarations
from tests.helpers import rng


def _lying_model() -> onnx.ModelProto:
    """x[N,S,4] -> MatMul(w1) -> Relu -> MatMul(w2) -> logits[N,S,3], with the hidden value
    declared at rank 2 and the output declared [N, 3]: ONNX Runtime runs it all the same."""
    weights = [numpy_helper.from_array(rng(1).normal(0, 0.5, (4, 8)).astype(np.float32), "w1"),
               numpy_helper.from_array(rng(2).normal(0, 0.5, (8, 3)).astype(np.float32), "w2")]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["logits"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "S", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])], weights,
        value_info=[helper.make_tensor_value_info("r", TensorProto.FLOAT, ["N", 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_contradicted_declarations_are_found_and_corrected_on_a_copy() -> None:
    model = _lying_model()
    assert declarations.contradicted(model) == {"r": ["N", "S", 8], "logits": ["N", "S", 3]}
    fixed = declarations.truthful(model)
    assert fixed is not model and [v.name for v in fixed.graph.value_info] == []
    assert [d.dim_param or d.dim_value for d in fixed.graph.output[0].type.tensor_type.shape.dim] == ["N", "S", 3]
    assert [v.name for v in model.graph.value_info] == ["r"]  # the argument as it was
    honest = _lying_model()
    del honest.graph.value_info[:]
    honest.graph.output[0].CopyFrom(helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", "S", 3]))
    assert declarations.truthful(honest) is honest


def test_train_runs_a_model_whose_declared_ranks_are_wrong(tmp_path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_lying_model(), path)
    np.savez(tmp_path / "d.npz", x=rng(3).normal(0, 1, (8, 5, 4)).astype(np.float32),
             labels=rng(4).normal(0, 1, (8, 5, 3)).astype(np.float32))
    for precision in ("float32", "float16"):
        assert main(["train", str(path), "--data", str(tmp_path / "d.npz"), "--loss", "mse", "--output", "logits",
                     "--labels", "labels", "--precision", precision, "-o", str(tmp_path / "t.onnx"), "--quiet"]) == 0
