"""QuantizeLinear and DequantizeLinear: the rules quantization-aware training differentiates by.

DequantizeLinear is linear in its scale: its scale gradient is checked against central finite
differences of the op itself (per tensor and per axis; int8, uint8 and int32 inputs).
QuantizeLinear rounds, and a finite difference sees rounding as a zero slope. So its
straight-through rule is checked exactly (the output's gradient where the value is in range,
zero where it saturates), a Q -> DQ pair's scale against LSQ's formula, and whole QDQ nets
against finite differences of their frozen-rounding surrogate: the same net in float64 with each
rounding offset ``round(x / s) - x / s`` held at its current value, saturation kept, which is the
function a straight-through estimator differentiates exactly.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite import UserError
from amp_rewrite.autodiff.gradient import default_parameters
from amp_rewrite.training import gradient_model
from tests.gradcases import Case, normal, positive, rng
from tests.gradcheck import analytic, assert_close, case_model, numeric, ort_run

OPSET = 19
"""onnx's reference evaluator runs DequantizeLinear from opset 19 on (the rules hold from 10)."""
LINEAR_STEP = 0.1
"""DequantizeLinear is linear in its scale: a large step is exact and keeps float32 rounding small."""


def ints(low: int, high: int, *shape: int, dtype=np.int8, seed: int = 0) -> np.ndarray:
    return rng(seed).integers(low, high + 1, shape).astype(dtype)


DEQUANTIZE_CASES = [
    Case("DequantizeLinear", {"x": ints(-128, 127, 3, 4), "s": np.array(0.05), "zp": np.array(3, np.int8)},
         opset=OPSET, id="int8-per-tensor"),
    Case("DequantizeLinear", {"x": ints(0, 255, 2, 3, 4, dtype=np.uint8), "s": positive(3),
                              "zp": ints(100, 150, 3, dtype=np.uint8, seed=1)}, attrs={"axis": 1}, opset=OPSET,
         id="uint8-per-axis"),
    Case("DequantizeLinear", {"x": ints(-3, 3, 2, 3, 2, 2, seed=2), "s": positive(2, seed=3),
                              "zp": np.zeros(2, np.int8)}, attrs={"axis": 0}, opset=OPSET,
         id="int8-per-output-channel"),
    Case("DequantizeLinear", {"x": ints(-5000, 5000, 5, dtype=np.int32), "s": np.array([1e-3]),
                              "zp": np.array(0, np.int32)}, opset=OPSET, id="int32-bias-one-element-scale"),
    Case("DequantizeLinear", {"x": ints(-5000, 5000, 4, 3, dtype=np.int32), "s": positive(3, seed=4), "zp": None},
         attrs={"axis": -1}, opset=OPSET, id="int32-last-axis-no-zero-point"),
]


@pytest.mark.parametrize("case", DEQUANTIZE_CASES, ids=lambda c: c.name)
def test_dequantize_scale_gradient_matches_finite_differences(case: Case):
    model, wrt = case_model(case, np.float32)  # the op's scale is float32 at these opsets
    assert wrt == ["s"]
    want = numeric(model, wrt, LINEAR_STEP)
    for runner in ("reference", "ort"):
        assert_close(analytic(model, wrt, runner), want, 1e-5, 1e-5, f"{case.name} ({runner})")


# -- a Q -> DQ pair ---------------------------------------------------------------------------------
def in_steps(scale: np.ndarray, zero_point: np.ndarray, dtype, shape: tuple[int, ...], axis: int | None,
             seed: int = 0) -> np.ndarray:
    """float32 values ``(k + f) * scale``: k whole steps from zero_point, some past either end of the type's
    range (they saturate) and none at its ends; ``|f| <= 0.3``, away from rounding's midpoints."""
    info = np.iinfo(dtype)
    gen = rng(seed)
    zp = along(zero_point.astype(np.int64), axis, len(shape))
    low, high = info.min - zp, info.max - zp
    k = gen.integers(low - 12, high + 13, shape)
    k = np.where((k == low) | (k == high), k + 1, k)  # no value on the edge of the range
    x = (k + gen.uniform(-0.3, 0.3, shape)) * along(scale, axis, len(shape))
    return x.astype(np.float32)


def along(value: np.ndarray, axis: int | None, rank: int) -> np.ndarray:
    """A scale-shaped array laid along ``axis`` of a rank-``rank`` tensor (as is when per tensor)."""
    return value if axis is None else value.reshape([-1] + [1] * (rank - 1 - axis))


def pair_model(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, axis: int | None) -> onnx.ModelProto:
    """``loss = sum(DequantizeLinear(QuantizeLinear(x, s, zp), s, zp) * R)``: one scale feeds both."""
    attrs = {} if axis is None else {"axis": axis}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], **attrs),
             helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], **attrs),
             helper.make_node("Mul", ["y", "R"], ["terms"]),
             helper.make_node("ReduceSum", ["terms"], ["loss"], keepdims=0)]
    inits = [numpy_helper.from_array(x, "x"), numpy_helper.from_array(scale.astype(np.float32), "s"),
             numpy_helper.from_array(zero_point, "zp"),
             numpy_helper.from_array(normal(*x.shape, seed=7).astype(np.float32), "R")]
    return _model(nodes, inits)


def _model(nodes, inits, opset: int = OPSET) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "qdq", [], [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


PAIRS = {
    "int8-per-tensor": (np.array(0.05), np.array(3, np.int8), (3, 8), None),
    "uint8-per-tensor-one-element": (np.array([0.02]), np.array([128], np.uint8), (16,), None),
    "uint8-per-axis": (positive(4, seed=5, low=0.01, high=0.1), ints(20, 200, 4, dtype=np.uint8), (2, 4, 5), 1),
    "int8-last-axis": (positive(5, seed=6, low=0.01, high=0.1), ints(-10, 10, 5), (3, 5), 1),
}


def _pair(name: str):
    scale, zero_point, shape, axis = PAIRS[name]
    x = in_steps(scale, zero_point, zero_point.dtype, shape, axis)
    return pair_model(x, scale, zero_point, axis), x, scale.astype(np.float32), zero_point, axis


def _levels(x, scale, zero_point, axis) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x / s, round(x / s) + zp, whether that is in the type's range), as QuantizeLinear computes them."""
    info = np.iinfo(zero_point.dtype)
    steps = x / along(scale, axis, x.ndim)
    levels = np.round(steps) + along(zero_point.astype(np.float32), axis, x.ndim)
    return steps, levels, (levels >= info.min) & (levels <= info.max)


@pytest.mark.parametrize("name", PAIRS)
def test_straight_through_passes_the_gradient_where_in_range_and_none_where_saturated(name):
    model, x, scale, zero_point, axis = _pair(name)
    *_, inside = _levels(x, scale, zero_point, axis)
    assert inside.any() and not inside.all(), "the data reaches both sides of saturation"
    r = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "R"))
    for runner in ("reference", "ort"):
        got = analytic(model, ["x"], runner)["x_grad"]
        np.testing.assert_allclose(got, np.where(inside, r, 0), rtol=1e-6, atol=0, err_msg=runner)


@pytest.mark.parametrize("name", PAIRS)
def test_a_pair_scale_gets_the_learned_step_size_gradient(name):
    """Q's share and DQ's sum to LSQ's: round(x/s) - x/s in range, qmin - zp or qmax - zp beyond it."""
    model, x, scale, zero_point, axis = _pair(name)
    steps, levels, inside = _levels(x, scale, zero_point, axis)
    info = np.iinfo(zero_point.dtype)
    edge = np.clip(levels, info.min, info.max) - (levels - np.round(steps))  # the end it saturates at, less zp
    r = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "R"))
    per_element = r * np.where(inside, np.round(steps) - steps, edge)
    reduced = tuple(a for a in range(x.ndim) if axis is None or a != axis % x.ndim)
    want = per_element.sum(axis=reduced).reshape(scale.shape)
    assert_close(analytic(model, ["s"], "ort"), {"s_grad": want}, 1e-4, 1e-5, name)


@pytest.mark.parametrize("name", PAIRS)
def test_a_pair_matches_finite_differences_of_its_frozen_rounding_surrogate(name):
    model, *_ = _pair(name)
    want = numeric(frozen_rounding(model), ["x", "s"])
    for runner in ("reference", "ort"):
        assert_close(analytic(model, ["x", "s"], runner), want, 1e-4, 1e-5, f"{name} ({runner})")


# -- a QDQ net ----------------------------------------------------------------------------------------
NET_PARAMETERS = ["W0", "b0", "a_s", "w_s", "b_s", "o_s"]


def qdq_net() -> onnx.ModelProto:
    """x -> MatMul W0 + b0 -> Relu -> Q/DQ (uint8, a_s) -> MatMul DQ(int8 W1, w_s per column)
    + DQ(int32 b1, b_s) -> Q/DQ (int8, o_s) -> loss = sum(out * R): float weights upstream of a
    quantized activation, a quantized layer as a QDQ export writes it, and a quantized output."""
    f32 = np.float32
    arrays = {
        "x": normal(4, 5, seed=10).astype(f32), "W0": normal(5, 6, seed=11, scale=0.7).astype(f32),
        "b0": normal(6, seed=12, scale=0.1).astype(f32), "a_s": np.array(0.011, f32), "a_zp": np.array(10, np.uint8),
        "W1": ints(-100, 100, 6, 3, seed=13), "w_s": np.array([0.004, 0.006, 0.005], f32),
        "w_zp": np.zeros(3, np.int8), "b1": ints(-300, 300, 3, dtype=np.int32, seed=14),
        "b_s": np.array([0.001], f32), "b_zp": np.array(0, np.int32), "o_s": np.array(0.009, f32),
        "o_zp": np.array(-2, np.int8), "R": normal(4, 3, seed=15).astype(f32),
    }
    node = helper.make_node
    nodes = [node("MatMul", ["x", "W0"], ["h0"]), node("Add", ["h0", "b0"], ["h1"]), node("Relu", ["h1"], ["h"]),
             node("QuantizeLinear", ["h", "a_s", "a_zp"], ["hq"]),
             node("DequantizeLinear", ["hq", "a_s", "a_zp"], ["a"]),
             node("DequantizeLinear", ["W1", "w_s", "w_zp"], ["w"], axis=1),
             node("DequantizeLinear", ["b1", "b_s", "b_zp"], ["b"]),
             node("MatMul", ["a", "w"], ["o0"]), node("Add", ["o0", "b"], ["o"]),
             node("QuantizeLinear", ["o", "o_s", "o_zp"], ["oq"]),
             node("DequantizeLinear", ["oq", "o_s", "o_zp"], ["out"]),
             node("Mul", ["out", "R"], ["terms"]), node("ReduceSum", ["terms"], ["loss"], keepdims=0)]
    return _model(nodes, [numpy_helper.from_array(a, n) for n, a in arrays.items()])


def test_the_straight_through_rule_reaches_the_weights_upstream_of_a_quantized_activation():
    assert set(default_parameters(qdq_net(), "loss")) == {*NET_PARAMETERS, "x", "R"}


def test_a_qdq_net_matches_finite_differences_of_its_frozen_rounding_surrogate():
    model = qdq_net()
    quantized = _quantized(model)
    assert all(inside.any() for *_, inside in quantized.values()), "every quantizer has values in range"
    assert not quantized["o"][2].all(), "the output saturates somewhere"
    want = numeric(frozen_rounding(model), NET_PARAMETERS)
    for runner in ("reference", "ort"):
        assert_close(analytic(model, NET_PARAMETERS, runner), want, 1e-3, 1e-5, f"QDQ net ({runner})")


# -- what is refused ----------------------------------------------------------------------------------
def test_blocked_scales_and_float8_outputs_are_refused_by_name():
    blocked = _model([helper.make_node("DequantizeLinear", ["q", "s"], ["y"], axis=1, block_size=2, name="dq"),
                      helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)],
                     [numpy_helper.from_array(ints(-5, 5, 4, 4), "q"),
                      numpy_helper.from_array(np.ones((4, 2), np.float32), "s")], opset=21)
    with pytest.raises(UserError, match="DequantizeLinear node 'dq': blocked quantization"):
        gradient_model(blocked, "loss")
    zero = helper.make_tensor("zp", TensorProto.FLOAT8E4M3FN, [], [0.0])
    float8 = _model([helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="q8"),
                     helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"]),
                     helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)],
                    [numpy_helper.from_array(np.ones(3, np.float32), "x"),
                     numpy_helper.from_array(np.array(0.5, np.float32), "s"), zero], opset=19)
    with pytest.raises(UserError, match="QuantizeLinear node 'q8': only quantization to integers"):
        gradient_model(float8, "loss", ["x"])


# -- the surrogate --------------------------------------------------------------------------------------
def frozen_rounding(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` in float64 with each QuantizeLinear written as ``clip(x / s + d + zp)``, ``d`` the
    rounding offset ``round(x / s) - x / s`` measured at the model's weights (an initializer, which
    finite differences leave alone), and each DequantizeLinear as ``(x - zp) * s``."""
    arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    quantized = _quantized(model)
    for value, (_, levels, _) in quantized.items():
        info = np.iinfo(next(arrays[n.input[2]] for n in model.graph.node if n.input[:1] == [value]).dtype)
        assert not np.isin(levels, [info.min, info.max]).any(), f"{value}: a value rounds to an end of the range"
    offsets = {value: np.round(steps) - steps for value, (steps, _, _) in quantized.items()}
    ranks = {name: a.ndim for name, a in {**arrays, **offsets}.items()}
    inits = [numpy_helper.from_array(a.astype(np.float64) if a.dtype.kind == "f" else a, n) for n, a in arrays.items()]
    nodes = []
    for node in model.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            nodes.append(node)
            continue
        (x, scale, zero_point), out = node.input, node.output[0]
        ranks[out] = rank = ranks[x]
        axis = _axis(node, arrays[scale], rank)
        s = scale
        if axis is not None and axis != rank - 1:
            inits.append(numpy_helper.from_array(np.array([-1] + [1] * (rank - 1 - axis), np.int64), f"{out}_lay"))
            s = f"{out}_scale"
            nodes.append(helper.make_node("Reshape", [scale, f"{out}_lay"], [s]))
        zp = arrays[zero_point].astype(np.float64)
        inits.append(numpy_helper.from_array(along(zp, axis, rank), f"{out}_zp"))
        if node.op_type == "QuantizeLinear":
            info = np.iinfo(arrays[zero_point].dtype)
            inits += [numpy_helper.from_array(offsets[x], f"{out}_d"),
                      numpy_helper.from_array(np.array(info.min, np.float64), f"{out}_min"),
                      numpy_helper.from_array(np.array(info.max, np.float64), f"{out}_max")]
            nodes += [helper.make_node("Div", [x, s], [f"{out}_steps"]),
                      helper.make_node("Sum", [f"{out}_steps", f"{out}_d", f"{out}_zp"], [f"{out}_real"]),
                      helper.make_node("Clip", [f"{out}_real", f"{out}_min", f"{out}_max"], [out])]
        else:
            nodes += [helper.make_node("Cast", [x], [f"{out}_x"], to=TensorProto.DOUBLE),
                      helper.make_node("Sub", [f"{out}_x", f"{out}_zp"], [f"{out}_q"]),
                      helper.make_node("Mul", [f"{out}_q", s], [out])]
    graph = helper.make_graph(nodes, "frozen", [], [helper.make_tensor_value_info("loss", TensorProto.DOUBLE, [])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _quantized(model: onnx.ModelProto) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each QuantizeLinear's input value: its ``_levels``, from ONNX Runtime's forward."""
    arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    quantizers = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    computed = [n.input[0] for n in quantizers if n.input[0] not in arrays]
    probe.graph.output.extend(helper.make_tensor_value_info(v, TensorProto.FLOAT, None) for v in computed)
    values = {**arrays, **ort_run(probe, {}, computed)}
    found = {}
    for node in quantizers:
        x, scale, zero_point = node.input
        found[x] = _levels(values[x], arrays[scale], arrays[zero_point], _axis(node, arrays[scale], values[x].ndim))
    return found


def _axis(node: onnx.NodeProto, scale: np.ndarray, rank: int) -> int | None:
    """The node's per-axis axis (normalized), or None when its scale is one value."""
    if scale.size == 1:
        return None
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 1) % rank
