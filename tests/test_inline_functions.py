"""InlineFunctions: the bodies of the model's own functions are converted like the rest of it
(a call left whole was an op no policy lists, float32 with Casts around it)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser

from amp_rewrite import ConvertOptions, analyze, convert
from amp_rewrite.inputs import samples
from amp_rewrite.runtime import instrument
from tests.gradcheck import directional_check, with_loss
from tests.helpers import rng

# A block as a function (an exporter's export_modules_as_functions writes such), calling another,
# called twice; the model's own MatMul between the calls.
TEXT = """
<ir_version: 8, opset_import: ["" : 17, "local" : 1]>
agraph (float[2,8] x) => (float[2,8] y) {
    a = local.Block(x, w1)
    b = MatMul(a, w2)
    y = local.Block(b, w1)
}
<domain: "local", opset_import: ["" : 17, "local" : 1]>
Block (X, W) => (Y) {
    m = MatMul(X, W)
    Y = local.Act(m)
}
<domain: "local", opset_import: ["" : 17]>
Act (X) => (Y) {
    e = Exp(X)
    Y = Tanh(e)
}
"""


def _model() -> onnx.ModelProto:
    m = onnx.parser.parse_model(TEXT)
    for name, seed in (("w1", 1), ("w2", 2)):
        m.graph.initializer.append(onnx.numpy_helper.from_array(
            0.3 * rng(seed).standard_normal((8, 8)).astype(np.float32), name))
    onnx.checker.check_model(m, full_check=True)
    return m


def _output_types(m: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    return {v.name: v.type.tensor_type.elem_type for v in (*inferred.graph.value_info, *inferred.graph.output)}


def test_the_bodies_of_local_functions_are_inlined_and_their_matmuls_run_low() -> None:
    m = _model()
    before = m.SerializeToString()
    converted, report = convert(m, provider=None)
    assert m.SerializeToString() == before  # the argument is not modified
    onnx.checker.check_model(converted, full_check=True)
    assert not converted.functions and {n.domain for n in converted.graph.node} == {""}
    types = _output_types(converted)
    assert sorted(types[n.output[0]] for n in converted.graph.node if n.op_type == "MatMul") == \
        [onnx.TensorProto.FLOAT16] * 3  # the model's own and the one in each call
    assert {types[n.output[0]] for n in converted.graph.node if n.op_type in ("Exp", "Tanh")} == \
        {onnx.TensorProto.FLOAT}  # deny (Exp) stays float32 inside the bodies too
    assert any("inlined the model's 2 local function(s)" in note for note in report.notes)
    x = rng(3).standard_normal((2, 8)).astype(np.float32)
    want = instrument.session(m).run(None, {"x": x})[0]
    got = instrument.session(converted).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)


def test_analyze_sees_the_inlined_bodies_without_editing_the_model() -> None:
    m = _model()
    analysis = analyze(m, ConvertOptions(provider=None, range_check="off"))
    assert len(m.functions) == 2
    assert sorted(analysis.index.nodes[i].op_type for i in analysis.coloring.decisions) == \
        sorted(["MatMul"] * 3 + ["Exp", "Tanh"] * 2)
    assert any("inlined" in note for note in analysis.notes)


def test_generated_inputs_follow_a_reshape_inside_a_function() -> None:
    """The rules that size generated inputs read the bodies too: batch x 16 reshaped to a
    constant [1, 4, 16] inside a function makes batch 4 (8, the default, does not run). ``check``
    draws its inputs from the model as given, functions and all (no set ran on PyTorch's
    BERT exported with each module a function)."""
    m = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17, "local" : 1]>
    agraph (float[batch,16] x) => (float[1,4,16] y) {
        a = MatMul(x, w)
        y = local.Fold(a)
    }
    <domain: "local", opset_import: ["" : 17]>
    Fold (X) => (Y) {
        shape = Constant<value = int64[3] {1, 4, 16}>()
        Y = Reshape(X, shape)
    }
    """)
    m.graph.initializer.append(onnx.numpy_helper.from_array(rng(1).standard_normal((16, 16)).astype(np.float32), "w"))
    text, data, _ = next(samples.attempts(m))
    assert text.startswith("batch=4 (from Reshape") and data[0]["x"].shape == (4, 16)
    assert instrument.session(m).run(None, data[0])[0].shape == (1, 4, 16)
    assert convert(m, provider=None)[1].range_check.startswith("measured")


def test_a_model_with_functions_is_differentiated_through_their_bodies() -> None:
    """``gradient_model`` inlines the calls (no rule exists for a model's own ops; it said "no
    gradient rule for Block"): the gradients match central differences of the loss."""
    feeds = {"x": rng(4).standard_normal((2, 8)).astype(np.float32)}
    directional_check(with_loss(_model(), feeds), feeds, ["w1", "w2"])
