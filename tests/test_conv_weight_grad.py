"""Conv weight-gradient formulations (``autodiff.rules.conv_weight_grad``) give formulation A's dW.

Each formulation, forced through ``gradient_model(..., conv_weight_grad=...)``, is checked
against central finite differences in float64 (onnx's reference evaluator) and against ``direct``
(formulation A, itself checked in ``tests/test_gradients.py``) on ONNX Runtime in float32, over
a grid of strides, pads, dilations, groups, 1-D/2-D/3-D, Conv and ConvTranspose, batches 32 and
48 (split into 2 and 3 parts: N/g >= 16). Where a formulation does not apply it falls back to
``direct``: the same graph, byte for byte. ``auto`` is checked as a table of shapes.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite.autodiff import gradient_model
from amp_rewrite.autodiff.conv_weight_grad import ConvShape, choose, split
from amp_rewrite.errors import UserError
from tests.gradcheck import assert_close, numeric, ort_run
from tests.reference_ops import evaluator

FORMULATIONS = ("grouped", "transposed", "im2col")


def conv_model(x: tuple, w: tuple, op: str = "Conv", dtype=np.float64, batch: int | str | None = None,
               **attrs) -> onnx.ModelProto:
    """``loss = sum(op(x, w) * R)`` with x, w and R fixed random initializers (x an input of
    extent ``batch`` in its first axis where ``batch`` is given); only ``w`` is differentiated."""
    rng = np.random.default_rng(0)
    arrays = {"x": rng.normal(size=x), "w": rng.normal(0, 0.5, size=w)}
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node(op, ["x", "w"], ["y"], **attrs)
    forward = helper.make_model(helper.make_graph(
        [node], "f", [helper.make_tensor_value_info(k, elem, list(v.shape)) for k, v in arrays.items()],
        [helper.make_tensor_value_info("y", elem, None)]), opset_imports=[helper.make_opsetid("", 17)])
    y = onnx.shape_inference.infer_shapes(forward).graph.output[0].type.tensor_type.shape
    arrays["r"] = rng.normal(size=[d.dim_value for d in y.dim])
    inits = [numpy_helper.from_array(v.astype(dtype), k) for k, v in arrays.items()]
    inputs = []
    if batch is not None:
        inputs = [helper.make_tensor_value_info("x", elem, [batch, *x[1:]])]
        inits = inits[1:]
    graph = helper.make_graph(
        [node, helper.make_node("Mul", ["y", "r"], ["weighted"]),
         helper.make_node("ReduceSum", ["weighted"], ["loss"], keepdims=0)], "case", inputs,
        [helper.make_tensor_value_info("loss", elem, [])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


GRID = {
    "2d-pads": ((32, 3, 6, 6), (4, 3, 3, 3), "Conv", dict(pads=[1, 1, 1, 1])),
    "2d-stride2-asymmetric-pads": ((48, 2, 7, 6), (3, 2, 3, 2), "Conv", dict(strides=[2, 2], pads=[1, 0, 0, 1])),
    "2d-strides-remainder": ((32, 2, 6, 5), (2, 2, 3, 2), "Conv", dict(strides=[2, 3], pads=[0, 1, 1, 0])),
    "2d-dilation2": ((32, 2, 7, 7), (3, 2, 2, 3), "Conv", dict(dilations=[2, 2], pads=[1, 1, 1, 1])),
    "2d-groups2": ((32, 4, 6, 5), (4, 2, 3, 3), "Conv", dict(group=2, strides=[1, 2], pads=[1, 1, 1, 1])),
    "2d-depthwise": ((48, 3, 5, 5), (6, 1, 3, 3), "Conv", dict(group=3, pads=[1, 0, 1, 2])),
    "2d-depthwise-dilation2-stride2": ((32, 2, 7, 7), (2, 1, 3, 3), "Conv",
                                       dict(group=2, dilations=[2, 2], strides=[2, 2], pads=[2, 2, 2, 2])),
    "2d-kernel-past-input": ((32, 2, 2, 2), (3, 2, 3, 3), "Conv", dict(pads=[0, 1, 1, 0])),
    "2d-same-upper": ((48, 2, 6, 7), (2, 2, 3, 3), "Conv", dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    "1d-stride2-pads": ((32, 3, 9), (4, 3, 3), "Conv", dict(strides=[2], pads=[1, 2])),
    "1d-dilation2": ((48, 2, 10), (3, 2, 3), "Conv", dict(dilations=[2], pads=[2, 1])),
    "3d": ((32, 2, 4, 4, 3), (2, 2, 2, 2, 2), "Conv", dict(strides=[2, 1, 1], pads=[1, 0, 0, 0, 1, 1])),
    "transpose-strides-output-padding": ((32, 2, 3, 4), (2, 2, 3, 3), "ConvTranspose",
                                         dict(strides=[2, 2], pads=[1, 0, 0, 1], output_padding=[1, 1])),
    "transpose-dilations": ((32, 2, 3, 3), (2, 2, 2, 2), "ConvTranspose", dict(dilations=[2, 2], strides=[1, 2])),
    "transpose-depthwise-1d": ((48, 3, 4), (3, 1, 3), "ConvTranspose", dict(group=3, strides=[2], pads=[1, 0])),
}
"""Conv and ConvTranspose shapes: (x, w, op, attributes)."""

ORT_ONLY = {
    "transpose-groups2": ((32, 4, 3, 3), (4, 2, 3, 3), "ConvTranspose", dict(group=2, strides=[2, 2])),
}
"""Shapes whose forward onnx's reference evaluator computes wrongly (a grouped ConvTranspose
with several channels per group)."""


def grads(model: onnx.ModelProto, mode: str, runner: str = "reference") -> np.ndarray:
    grad = gradient_model(model, "loss", ["w"], conv_weight_grad=mode)
    onnx.checker.check_model(grad, full_check=True)
    if runner == "reference":
        return evaluator(grad).run(["w_grad"], {})[0]
    return ort_run(grad, {}, ["w_grad"])["w_grad"]


@functools.cache
def finite_differences(name: str) -> dict[str, np.ndarray]:
    x, w, op, attrs = GRID[name]
    return numeric(conv_model(x, w, op, **attrs), ["w"])


@pytest.mark.parametrize("mode", FORMULATIONS)
@pytest.mark.parametrize("name", list(GRID))
def test_formulation_matches_finite_differences(name, mode):
    """float64, onnx's reference evaluator: dW of each formulation against central differences."""
    x, w, op, attrs = GRID[name]
    got = grads(conv_model(x, w, op, **attrs), mode)
    assert_close({"w_grad": got}, finite_differences(name), 1e-5, 1e-7, f"{name} {mode}")


@pytest.mark.parametrize("mode", FORMULATIONS)
@pytest.mark.parametrize("name", [*GRID, *ORT_ONLY])
def test_formulation_matches_direct_on_onnx_runtime(name, mode):
    """float32, ONNX Runtime: dW of each formulation within float32 rounding of formulation A's."""
    x, w, op, attrs = {**GRID, **ORT_ONLY}[name]
    model = conv_model(x, w, op, np.float32, **attrs)
    direct, got = grads(model, "direct", "ort"), grads(model, mode, "ort")
    assert got.dtype == np.float32 and got.shape == direct.shape
    assert np.abs(got - direct).max() <= 1e-5 * np.abs(direct).max()


@pytest.mark.parametrize("mode", FORMULATIONS)
@pytest.mark.parametrize("shape", [((32, 3, 8, 8), (4, 3, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1])),
                                   ((48, 4, 6, 6), (4, 2, 3, 3), dict(group=2, pads=[1, 1, 1, 1]))],
                         ids=["stride2", "groups2"])
def test_half_operands_sum_partials_in_float32(shape, mode):
    """float16 operands on ONNX Runtime: partial kernels cast to float32 before the one ReduceSum
    (grouped, im2col), dW returned as float16, within float16 rounding of the float64 truth."""
    x, w, attrs = shape
    half = conv_model(x, w, "Conv", np.float16, **attrs)
    exact = onnx.ModelProto()
    exact.CopyFrom(half)
    for t in exact.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))
    exact.graph.output[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    want = grads(exact, "direct")
    grad = gradient_model(half, "loss", ["w"], conv_weight_grad=mode)
    got = ort_run(grad, {}, ["w_grad"])["w_grad"]
    assert got.dtype == np.float16
    assert np.abs(got.astype(np.float64) - want).max() <= 2e-3 * np.abs(want).max()
    producers = {o: n for n in grad.graph.node for o in n.output}
    sums = [n for n in grad.graph.node if n.op_type == "ReduceSum" and n.input[0] in producers]
    widened = [n for n in sums if producers[n.input[0]].op_type == "Cast"
               and producers[n.input[0]].attribute[0].i == TensorProto.FLOAT]
    assert len(widened) == (0 if mode == "transposed" else 1)


# -- structure ----------------------------------------------------------------------------------------
def two_convs(batch: int = 32) -> onnx.ModelProto:
    """x -> Conv(w1) -> Relu -> Conv(w2, groups 2) -> loss, no biases."""
    rng = np.random.default_rng(0)
    text = f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[{batch}, 3, 8, 8] x) => (float loss) {{
        c1 = Conv <pads = [1, 1, 1, 1]> (x, w1)
        a1 = Relu (c1)
        c2 = Conv <group = 2, strides = [2, 2], pads = [1, 1, 1, 1]> (a1, w2)
        loss = ReduceSum <keepdims = 0> (c2)
    }}"""
    model = onnx.parser.parse_model(text)
    model.graph.initializer.extend([
        numpy_helper.from_array(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(size=(6, 2, 3, 3)).astype(np.float32), "w2")])
    return model


def _backward_ancestors(grad: onnx.ModelProto, forward: onnx.ModelProto, value: str) -> list[onnx.NodeProto]:
    """The backward nodes (those after the forward's) that ``value`` is computed from."""
    producers = {o: n for n in grad.graph.node[len(forward.graph.node):] for o in n.output}
    found: dict[int, onnx.NodeProto] = {}
    pending = [value]
    while pending:
        node = producers.get(pending.pop())
        if node is not None and id(node) not in found:
            found[id(node)] = node
            pending.extend(node.input)
    return list(found.values())


def test_grouped_is_one_grouped_conv_and_one_reduce_sum_per_weight():
    model = two_convs()
    grad = gradient_model(model, "loss", ["w1", "w2"], conv_weight_grad="grouped")
    for weight, groups in (("w1", 2), ("w2", 4)):  # 32 samples in 2 parts, times the forward's groups
        nodes = _backward_ancestors(grad, model, f"{weight}_grad")
        convs = [n for n in nodes if n.op_type == "Conv"]
        assert [helper.get_attribute_value(a) for n in convs for a in n.attribute if a.name == "group"] == [groups]
        assert [n.op_type for n in nodes].count("ReduceSum") == 1


def test_direct_is_the_default_graph():
    model = two_convs()
    default = gradient_model(model, "loss", ["w1", "w2"]).SerializeToString()
    assert gradient_model(model, "loss", ["w1", "w2"], conv_weight_grad="direct").SerializeToString() == default


@pytest.mark.parametrize("mode, model", [
    ("grouped", conv_model((16, 2, 5, 5), (3, 2, 3, 3), dtype=np.float32)),  # 16 samples do not split
    ("grouped", conv_model((32, 2, 5, 5), (3, 2, 3, 3), dtype=np.float32, batch="N")),  # batch not static
    ("im2col", conv_model((32, 2, 5, 5), (3, 2, 3, 3), dtype=np.float32, batch="N")),
    ("transposed", conv_model((32, 2, 7, 7), (3, 2, 2, 3), dtype=np.float32, dilations=[2, 2])),
    ("transposed", conv_model((32, 4, 6, 5), (4, 2, 3, 3), dtype=np.float32, group=2)),
    ("auto", conv_model((32, 2, 5, 5), (3, 2, 3, 3), dtype=np.float32)),  # tiny
], ids=["grouped-batch16", "grouped-dynamic", "im2col-dynamic", "transposed-dilated", "transposed-groups",
        "auto-tiny"])
def test_where_a_formulation_does_not_apply_the_graph_is_direct(mode, model):
    want = gradient_model(model, "loss", ["w"]).SerializeToString()
    assert gradient_model(model, "loss", ["w"], conv_weight_grad=mode).SerializeToString() == want


@pytest.mark.parametrize("x, w, attrs, chosen", [
    ((32, 16, 32, 32), (32, 16, 3, 3), dict(pads=[1, 1, 1, 1]), "grouped"),
    ((32, 3, 64, 64), (64, 3, 3, 3), dict(pads=[1, 1, 1, 1]), "im2col"),
])
def test_auto_builds_what_the_rule_chooses(x, w, attrs, chosen):
    model = conv_model(x, w, "Conv", np.float32, **attrs)
    want = gradient_model(model, "loss", ["w"], conv_weight_grad=chosen).SerializeToString()
    assert gradient_model(model, "loss", ["w"], conv_weight_grad="auto").SerializeToString() == want


def test_an_unknown_mode_is_refused():
    with pytest.raises(UserError, match="conv_weight_grad 'fast' is not one of direct, grouped"):
        gradient_model(two_convs(), "loss", ["w1"], conv_weight_grad="fast")


# -- the rule -----------------------------------------------------------------------------------------
def seed_shape(batch, channels, filters, kernel, stride, pad, size, elem=TensorProto.FLOAT16, group=1,
               dilation=1) -> ConvShape:
    """A 2-D Conv's weight-gradient geometry (square kernel and input, symmetric pads)."""
    out = (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1
    return ConvShape(batch, channels, filters, group, (kernel,) * 2, (stride,) * 2, (dilation,) * 2, (pad,) * 2,
                     (pad,) * 2, (size,) * 2, (out,) * 2, elem)


@pytest.mark.parametrize("batch, parts", [(256, 8), (64, 4), (48, 3), (40, 2), (32, 2), (31, 1), (16, 1), (24, 1)])
def test_split_is_the_largest_divisor_up_to_8_leaving_16_samples(batch, parts):
    assert split(seed_shape(batch, 3, 64, 7, 2, 3, 256)) == parts


@pytest.mark.parametrize("shape, mode, chosen", [
    # the seed CNN's conv1 (3 -> 64, 7x7/2, 256x256) and conv2 (64 -> 128, 11x11/2, 128x128)
    (seed_shape(256, 3, 64, 7, 2, 3, 256), "auto", "grouped"),
    (seed_shape(32, 3, 64, 7, 2, 3, 256), "auto", "grouped"),
    (seed_shape(256, 64, 128, 11, 2, 5, 128), "auto", "grouped"),
    (seed_shape(16, 64, 128, 11, 2, 5, 128), "auto", "direct"),  # 16 samples do not split
    (seed_shape(256, 3, 64, 3, 1, 1, 224), "auto", "im2col"),  # a 3x3 RGB first layer
    (seed_shape(8, 3, 64, 3, 1, 1, 224), "auto", "im2col"),
    (seed_shape(256, 512, 512, 3, 1, 1, 14), "auto", "direct"),  # dW fills the device
    (seed_shape(32, 2, 3, 3, 1, 1, 5), "auto", "direct"),  # tiny
    (seed_shape(256, 3, 64, 7, 2, 3, 256, elem=TensorProto.DOUBLE), "auto", "direct"),
    (seed_shape(256, 64, 64, 3, 1, 1, 56, group=64), "auto", "grouped"),  # depthwise: not im2col
    (seed_shape(32, 2, 3, 3, 1, 1, 5), "grouped", "grouped"),  # forced: tiny does not matter
    (seed_shape(32, 4, 4, 3, 1, 1, 5, group=2), "transposed", "direct"),
    (seed_shape(32, 4, 4, 3, 1, 1, 5, dilation=2), "transposed", "direct"),
    (seed_shape(32, 4, 4, 3, 2, 1, 5), "transposed", "transposed"),
    (seed_shape(32, 4, 4, 3, 1, 1, 5, group=2, dilation=2), "im2col", "im2col"),
    (seed_shape(256, 3, 64, 7, 2, 3, 256), "direct", "direct"),
    (ConvShape(None, 3, 64, 1, (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), (8, 8), (8, 8), TensorProto.FLOAT),
     "auto", "direct"),
])
def test_choose(shape, mode, chosen):
    choice = choose(shape, mode)
    assert choice.formulation == chosen, choice.why
    assert choice.why


def test_train_takes_the_formulation_and_trains_as_direct_does(tmp_path, capsys):
    """``train --conv-weight-grad``: grouped gives the weights direct gives (to float32 rounding);
    an unknown name is one line, exit 2, before anything is built."""
    from onnx import TensorProto, helper, numpy_helper

    from amp_rewrite.cli import main

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 6, 6])],
        [numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=rng.normal(0, 1, (64, 3, 6, 6)).astype(np.float32),
             labels=rng.normal(0, 1, (64, 4, 6, 6)).astype(np.float32))
    trained = {}
    for mode in ("direct", "grouped", "bogus"):
        code = main(["train", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "d.npz"), "--loss", "mse",
                     "--output", "y", "--precision", "float32", "--batch-size", "32", "--lr", "0.01",
                     "--conv-weight-grad", mode, "--graph-mode", "on", "-o", str(tmp_path / f"{mode}.onnx"),
                     "--quiet"])  # graph mode: the step takes batches of 32, which grouped splits in 2
        if mode == "bogus":
            assert code == 2
            err = capsys.readouterr().err.strip()
            assert err.count("\n") == 0 and "conv_weight_grad 'bogus' is not one of direct" in err, err
        else:
            assert code == 0
            trained[mode] = numpy_helper.to_array(onnx.load(tmp_path / f"{mode}.onnx").graph.initializer[0])
    np.testing.assert_allclose(trained["grouped"], trained["direct"], rtol=1e-5, atol=1e-6)
    from amp_rewrite.training import build

    step = build(str(tmp_path / "m.onnx"), loss="mse", output="y", precision="float32",
                 specialize={"x": [32, 3, 6, 6]}, conv_weight_grad="grouped")
    assert sorted(a.i for n in step.model.graph.node if n.op_type == "Conv" for a in n.attribute
                  if a.name == "group") == [2]
    assert not np.allclose(trained["direct"], numpy_helper.to_array(graph.initializer[0]))
