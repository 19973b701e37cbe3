"""Gradients of the convolution, pool, Pad and Resize rules through models the case table
(``tests/gradcases``) cannot express: graph inputs with a symbolic batch or symbolic spatial
extents, groups of several channels, ConvTranspose's output_shape, cropping (negative) and
run-time Pad pads, and Resize's float32 ``scales``.

Each test builds a model whose loss is ``sum(output * R)``, differentiates it with
``gradient_model``, runs the gradient graph on ONNX Runtime's CPU provider and compares it
with central finite differences: in float64 with ONNX's reference evaluator where that
implements the forward ops correctly, else on ONNX Runtime itself (the grouped
ConvTranspose, a cropping Pad) with a loss linear in every parameter, where central
differences are exact for any step.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from amp_rewrite.errors import UserError
from amp_rewrite.training import gradient_model
from tests.gradcheck import assert_close

F32, F64 = TensorProto.FLOAT, TensorProto.DOUBLE


def _model(nodes, inputs, params, loss_from, out_shape, elem, opset=17, extra_inits=()):
    """Nodes reading graph ``inputs`` (name, shape, elem) and initializers ``params``, then
    ``loss = sum(loss_from * R)`` with a fixed R of ``out_shape`` (broadcast over the batch)."""
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    r = np.random.default_rng(7).normal(0, 1, out_shape).astype(dtype)
    inits = [numpy_helper.from_array(np.asarray(v, dtype), k) for k, v in params.items()]
    inits += [numpy_helper.from_array(r, "R"), *extra_inits]
    nodes = [*nodes, helper.make_node("Mul", [loss_from, "R"], ["weighted"]),
             helper.make_node("ReduceSum", ["weighted"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, s, t in inputs],
                              [helper.make_tensor_value_info("loss", elem, [])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def _ort(model: onnx.ModelProto, feeds: dict, names: list[str]) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(names, feeds)


def _reference(model: onnx.ModelProto, feeds: dict, names: list[str]) -> list[np.ndarray]:
    return ReferenceEvaluator(model).run(names, feeds)


def _numeric(model: onnx.ModelProto, feeds: dict, wrt: list[str], run=_reference, eps: float = 1e-6) -> dict:
    """Central differences of the loss for every element of each initializer or feed in ``wrt``."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    grads = {}
    for name in wrt:
        base = feeds[name] if name in feeds else inits[name]
        g = np.zeros(base.shape, np.float64)
        for i in np.ndindex(base.shape):
            values = []
            for sign in (1, -1):
                shifted = base.copy()
                shifted[i] += sign * eps
                varied, varied_feeds = _with(model, feeds, name, shifted)
                values.append(float(run(varied, varied_feeds, ["loss"])[0]))
            g[i] = (values[0] - values[1]) / (2 * eps)
        grads[f"{name}_grad"] = g
    return grads


def _with(model: onnx.ModelProto, feeds: dict, name: str, value: np.ndarray):
    if name in feeds:
        return model, {**feeds, name: value}
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for t in m.graph.initializer:
        if t.name == name:
            t.CopyFrom(numpy_helper.from_array(value, name))
    return m, feeds


def _analytic(model: onnx.ModelProto, feeds: dict, wrt: list[str], run=_ort) -> dict:
    grad = gradient_model(model, "loss", wrt)
    onnx.checker.check_model(grad, full_check=True)
    names = [f"{w}_grad" for w in wrt]
    return dict(zip(names, run(grad, feeds, names)))


def _cast(feeds: dict, dtype) -> dict:
    return {k: v.astype(dtype) if v.dtype.kind == "f" else v for k, v in feeds.items()}


# -- the symbolic batch: Conv -> Relu -> MaxPool -> GlobalAveragePool --------------------------------
def _cnn(elem):
    rng = np.random.default_rng(0)
    params = {"W": rng.normal(0, 0.5, (4, 3, 3, 3)), "B": rng.normal(0, 0.5, 4)}
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["m"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["m"], ["p"])]
    return _model(nodes, [("x", ["N", 3, 8, 8], elem)], params, "p", (1, 4, 1, 1), elem)


@pytest.mark.parametrize("batch", [1, 3])
def test_symbolic_batch_conv_relu_maxpool_global_average_pool(batch):
    """A graph input with a symbolic batch: one gradient graph serves every batch size on ONNX
    Runtime, matching float64 finite differences; the MaxPool gets an Indices output."""
    x = np.random.default_rng(batch).normal(0, 1, (batch, 3, 8, 8))
    grad = gradient_model(_cnn(F32), "loss", wrt=["W", "B"])
    onnx.checker.check_model(grad, full_check=True)
    assert [d.dim_param for d in grad.graph.input[0].type.tensor_type.shape.dim][:1] == ["N"]
    assert len(next(n for n in grad.graph.node if n.op_type == "MaxPool").output) == 2
    got = dict(zip(["W_grad", "B_grad"], _ort(grad, {"x": x.astype(np.float32)}, ["W_grad", "B_grad"])))
    want = _numeric(_cnn(F64), {"x": x}, ["W", "B"])
    assert_close(got, want, 2e-3, 1e-4, f"batch {batch}")


# -- symbolic spatial extents: the run-time shape paths ------------------------------------------------
def _symbolic_spatial(elem):
    rng = np.random.default_rng(1)
    params = {"W": rng.normal(0, 0.5, (6, 2, 3, 2)), "B": rng.normal(0, 0.5, 6),
              "T": rng.normal(0, 0.5, (6, 3, 2, 3)), "TB": rng.normal(0, 0.5, 3)}
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], group=2, strides=[2, 2], pads=[1, 0, 0, 1]),
             helper.make_node("ConvTranspose", ["c", "T", "TB"], ["t"], strides=[2, 1], pads=[0, 1, 1, 0]),
             helper.make_node("AveragePool", ["t"], ["a"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                              ceil_mode=1),
             helper.make_node("GlobalAveragePool", ["a"], ["p"])]
    return _model(nodes, [("x", ["N", 4, "H", "W"], elem)], params, "p", (1, 3, 1, 1), elem)


@pytest.mark.parametrize("extent", [(7, 6), (8, 9)])
def test_symbolic_spatial_conv_conv_transpose_average_pool(extent):
    """Spatial extents unknown until run time (and groups of two input channels making three
    outputs each): Conv's input gradient is cut to the input's extent at run time, the weight
    gradients reshape by run-time extents, AveragePool's divisors (pads excluded, ceil_mode) are
    computed at run time; one graph serves both sizes."""
    x = np.random.default_rng(2).normal(0, 1, (2, 4, *extent))
    wrt = ["x", "W", "B", "T", "TB"]
    got = _analytic(_symbolic_spatial(F32), {"x": x.astype(np.float32)}, wrt)
    want = _numeric(_symbolic_spatial(F64), {"x": x}, wrt)
    assert_close(got, want, 2e-3, 1e-4, f"extent {extent}")


# -- grouped ConvTranspose and output_shape: on ONNX Runtime -------------------------------------------
@pytest.mark.parametrize("attrs", [
    {"group": 2, "strides": [2, 2], "pads": [1, 0, 0, 1], "output_padding": [1, 0]},
    {"group": 2, "strides": [2, 1], "dilations": [1, 2], "output_shape": [5, 7]},
    {"strides": [2, 2], "auto_pad": "SAME_LOWER"},
], ids=["groups-output-padding", "groups-output-shape", "same-lower"])
def test_conv_transpose_on_onnx_runtime(attrs):
    """ConvTranspose forms the reference evaluator gets wrong (several channels per group,
    output_shape), against finite differences of ONNX Runtime's own forward."""
    rng = np.random.default_rng(3)
    group = attrs.get("group", 1)
    x = rng.normal(0, 1, (2, 4, 3, 4))
    params = {"W": rng.normal(0, 0.5, (4, 3, 2, 3)), "B": rng.normal(0, 0.5, 3 * group)}
    node = helper.make_node("ConvTranspose", ["x", "W", "B"], ["y"], **attrs)
    graph = helper.make_graph([node], "probe", [helper.make_tensor_value_info("x", F32, x.shape)],
                              [helper.make_tensor_value_info("y", F32, None)],
                              [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in params.items()])
    probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    y_shape = _ort(probe, {"x": x.astype(np.float32)}, ["y"])[0].shape
    model = _model([node], [("x", [2, 4, 3, 4], F32)], params, "y", y_shape, F32)
    feeds = {"x": x.astype(np.float32)}
    wrt = ["x", "W", "B"]
    want = _numeric(model, feeds, wrt, run=_ort, eps=0.5)  # the loss is linear in each of them
    assert_close(_analytic(model, feeds, wrt), want, 2e-3, 1e-3, str(attrs))


# -- Pad that crops, and pads known only at run time -------------------------------------------------
@pytest.mark.parametrize("opset,pads,axes", [
    (17, [-1, 1, 2, -2], None),
    (18, [2, -1, -1, 1], [0, 1]),
], ids=["crop", "crop-axes"])
@pytest.mark.parametrize("runtime", [False, True], ids=["constant-pads", "runtime-pads"])
def test_pad_crop(opset, pads, axes, runtime):
    """Negative pads crop: the cropped positions get no gradient, the padding's gradient goes to
    constant_value; pads fed at run time take the same route with run-time Slice/Pad amounts."""
    x = np.random.default_rng(4).normal(0, 1, (3, 5))
    inputs = ["x", "pads", "value"] + (["axes"] if axes is not None else [])
    extra = [numpy_helper.from_array(np.asarray(axes, np.int64), "axes")] if axes is not None else []
    feeds = {}
    if runtime:
        feeds["pads"] = np.asarray(pads, np.int64)
    else:
        extra.append(numpy_helper.from_array(np.asarray(pads, np.int64), "pads"))
    out_shape = list(x.shape)
    for i, a in enumerate(axes if axes is not None else range(2)):
        out_shape[a] += pads[i] + pads[len(pads) // 2 + i]
    model = _model([helper.make_node("Pad", inputs, ["y"])], [("pads", [4], TensorProto.INT64)] if runtime else [],
                   {"x": x, "value": np.array(0.7)}, "y", out_shape, F64, opset=opset, extra_inits=extra)
    wrt = ["x", "value"]
    want = _numeric(model, feeds, wrt, run=_ort, eps=0.5)
    assert_close(_analytic(model, feeds, wrt), want, 1e-9, 1e-9, f"pads {pads}")


# -- Resize with float32 scales ------------------------------------------------------------------------
@pytest.mark.parametrize("attrs,scales", [
    ({"mode": "linear"}, [1, 1, 2, 1.5]),
    ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric"}, [1, 1, 0.5, 2]),
    ({"mode": "cubic", "coordinate_transformation_mode": "pytorch_half_pixel"}, [1, 1, 1.5, 0.75]),
], ids=["linear", "nearest", "cubic"])
def test_resize_scales_symbolic_batch(attrs, scales):
    """Resize with constant float32 scales over an input whose batch is symbolic (scale 1
    there: left alone)."""
    x = np.random.default_rng(5).normal(0, 1, (2, 2, 4, 4))
    scales_init = numpy_helper.from_array(np.asarray(scales, np.float32), "scales")
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)
    out = (1, 2, int(4 * scales[2]), int(4 * scales[3]))

    def build(elem):
        return _model([node], [("x", ["N", 2, 4, 4], elem)], {}, "y", out, elem, extra_inits=[scales_init])

    grad = _analytic(build(F32), {"x": x.astype(np.float32)}, ["x"])
    want = _numeric(build(F64), {"x": x}, ["x"], eps=0.5)  # Resize is linear in x
    assert_close(grad, want, 2e-3, 1e-4, str(attrs))


# -- Resize and copying Pad whose extents, sizes, scales or pads are known only at run time ----------
@pytest.mark.parametrize("attrs", [
    {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
    {"mode": "nearest"},
    {"mode": "nearest", "coordinate_transformation_mode": "align_corners", "nearest_mode": "round_prefer_ceil"},
    {"mode": "linear"},
    {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
    {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
    {"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"},
], ids=["nearest-torch", "nearest", "nearest-corners-ceil", "linear", "linear-corners", "linear-torch", "linear-sym"])
@pytest.mark.parametrize("by", ["sizes", "scales"])
def test_resize_to_a_run_time_shape(attrs, by):
    """A decoder's Resize to its skip connection's spatial extents (sizes from ``Shape``), or by
    scales fed at run time, over symbolic extents: the gradient is built from the run-time
    extents (no static shape anywhere), checked against finite differences."""
    x = np.random.default_rng(8).normal(0, 1, (1, 2, 3, 5))
    skip = np.zeros((1, 1, 7, 4)) if by == "sizes" else None
    feeds_of = {"sizes": lambda dtype: {"skip": skip.astype(dtype)},
                "scales": lambda dtype: {"scales": np.array([1, 1, 7 / 3, 0.8], np.float32)}}[by]
    if by == "sizes":
        nodes = [helper.make_node("Shape", ["x"], ["xs"], end=2), helper.make_node("Shape", ["skip"], ["ss"], start=2),
                 helper.make_node("Concat", ["xs", "ss"], ["sizes"], axis=0),
                 helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], **attrs)]
    else:
        nodes = [helper.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)]

    def build(elem):
        inputs = [("skip", ["N", 1, "H2", "W2"], elem)] if by == "sizes" else [("scales", [4], F32)]
        return _model(nodes, inputs, {"x": x}, "y", (1, 2, 7, 4), elem, opset=18)

    grad = _analytic(build(F32), feeds_of(np.float32), ["x"])
    # Resize is linear in x; the reference evaluator's Resize does not take float32 scales for float64
    want = _numeric(build(F64), feeds_of(np.float64), ["x"], eps=0.5) if by == "sizes" else \
        _numeric(build(F32), feeds_of(np.float32), ["x"], run=_ort, eps=0.5)
    assert_close(grad, want, 2e-3, 1e-4, str(attrs))


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap"])
@pytest.mark.parametrize("runtime", [True, False], ids=["runtime-pads", "symbolic-extents"])
def test_copying_pad_known_at_run_time(mode, runtime):
    """Reflect, edge and wrap Pad with pads fed at run time, or constant pads over symbolic
    extents (an audio front end's reflect pad of a [batch, samples] signal): the gradient
    scatters each output position's gradient onto the position it copies."""
    x = np.random.default_rng(9).normal(0, 1, (3, 5))
    pads = [1, 2, 2, 3]
    extra, inputs, feeds = [], [], {}
    if runtime:
        inputs.append(("pads", [4], TensorProto.INT64))
        feeds["pads"] = np.asarray(pads, np.int64)
    else:
        extra.append(numpy_helper.from_array(np.asarray(pads, np.int64), "pads"))
    nodes = [helper.make_node("Identity", ["w"], ["x"]), helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)]
    if not runtime:  # x's extents are known only at run time: it is a Reshape to a shape fed in
        inputs.append(("shape", [2], TensorProto.INT64))
        feeds["shape"] = np.asarray(x.shape, np.int64)
        nodes[0] = helper.make_node("Reshape", ["w", "shape"], ["x"])
    model = _model(nodes, inputs, {"w": x}, "y", (6, 10), F64, extra_inits=extra)
    want = _numeric(model, feeds, ["w"], run=_ort, eps=0.5)  # the loss is linear in w
    assert_close(_analytic(model, feeds, ["w"]), want, 1e-9, 1e-9, f"{mode} pads {pads}")


# -- what needs static shapes says so --------------------------------------------------------------
@pytest.mark.parametrize("node,message", [
    (helper.make_node("Conv", ["x", "W"], ["y"], name="conv_same", auto_pad="SAME_UPPER", strides=[2, 2]),
     r"Conv node 'conv_same': auto_pad=SAME_UPPER pads by the input's spatial shape, which is not static"),
    (helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="resize_sym", mode="cubic", axes=[2, 3]),
     r"Resize node 'resize_sym': it resizes to sizes but the input's extent along axis 2 is not static"),
], ids=["conv-same", "resize"])
def test_symbolic_spatial_needing_static_shapes_is_a_clear_error(node, message):
    extra = [numpy_helper.from_array(np.asarray([6, 6], np.int64), "sizes")]
    params = {"W": np.ones((2, 2, 3, 3))} if node.op_type == "Conv" else {}
    model = _model([node], [("x", ["N", 2, "H", "W"], F32)], params, "y", (1, 2, 1, 1), F32, opset=18,
                   extra_inits=extra)
    with pytest.raises(UserError, match=message):
        gradient_model(model, "loss", ["x"])
