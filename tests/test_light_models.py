"""The real-architecture models shipped in onnx (``onnx/backend/test/data/light``).

As shipped every weight is 0.02 and activations reach 1e10 and more: the
converter must notice (range check) and keep those regions in float32, so the
converted model never gives NaN or Inf where float32 does not. With random
weights (He initialisation, BatchNorm statistics near 1) most of the network
converts (deep residual sums that grow past the range-check limit stay float32),
and its outputs match float32's.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from amp_rewrite import convert
from tests.node_suite import evaluate

LIGHT = sorted(glob.glob(os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/light/*.onnx")))
REL_TOLERANCE = 2e-2
"""Max |mixed - fp32| relative to the output's largest magnitude, after 20-100 float16 layers."""


def _data_input(model: onnx.ModelProto) -> onnx.ValueInfoProto:
    weights = {t.name for t in model.graph.initializer}
    return next(i for i in model.graph.input if i.name not in weights)


def _feed(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    info = _data_input(model)
    shape = [d.dim_value for d in info.type.tensor_type.shape.dim]
    return {info.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}


def randomize_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """Replace the constant weights (ConstantOfShape fills, or initializers) by random ones:
    He-initialised conv/matmul weights, BatchNorm scale and variance near 1, small biases."""
    rng = np.random.default_rng(seed)
    roles = {}
    for node in model.graph.node:
        if node.op_type in ("Conv", "Gemm", "MatMul") and len(node.input) > 1:
            transposed = any(a.name == "transB" and a.i for a in node.attribute)
            roles[node.input[1]] = "weight_t" if transposed else "weight"
        if node.op_type == "BatchNormalization":
            roles.update({node.input[1]: "ones", node.input[4]: "ones"})
    out = onnx.ModelProto()
    out.CopyFrom(model)
    shapes = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    fills = [n for n in out.graph.node if n.op_type == "ConstantOfShape" and n.input[0] in shapes]
    for node in fills:
        out.graph.node.remove(node)
        shape = [int(d) for d in shapes[node.input[0]]]
        out.graph.initializer.append(numpy_helper.from_array(np.zeros(shape, np.float32), node.output[0]))
        if out.ir_version < 4:  # initializers must also be graph inputs
            out.graph.input.append(onnx.helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, shape))
    for tensor in out.graph.initializer:
        if tensor.data_type != onnx.TensorProto.FLOAT:
            continue
        shape = tuple(tensor.dims)
        role = roles.get(tensor.name)
        if role in ("weight", "weight_t"):
            fan_in = int(np.prod(shape[1:])) if len(shape) > 2 or role == "weight_t" else shape[0]
            values = rng.standard_normal(shape) * np.sqrt(2.0 / max(fan_in, 1))
        elif role == "ones":
            values = 1.0 + 0.1 * np.abs(rng.standard_normal(shape))
        else:
            values = 0.01 * rng.standard_normal(shape)
        tensor.CopyFrom(numpy_helper.from_array(values.astype(np.float32), tensor.name))
    return out


def _compare(original: onnx.ModelProto, mixed: onnx.ModelProto) -> tuple[float, bool]:
    """Relative max error of the mixed model against the float32 one, both run by onnx's
    reference evaluator (true float16 arithmetic), and whether NaN/Inf appeared."""
    feeds = _feed(original)
    want = np.asarray(evaluate(original, feeds)[0], np.float64)
    got = np.asarray(evaluate(mixed, feeds)[0], np.float64)
    new_nonfinite = bool((~np.isfinite(got) & np.isfinite(want)).any())
    finite = np.isfinite(want) & np.isfinite(got)
    scale = max(float(np.abs(want[finite]).max()), 1e-30) if finite.any() else 1.0
    return float(np.abs(got[finite] - want[finite]).max(initial=0.0)) / scale, new_nonfinite


@pytest.mark.slow
@pytest.mark.parametrize("path", LIGHT, ids=[os.path.basename(p) for p in LIGHT])
def test_light_model_as_shipped_never_gains_nan(path: str) -> None:
    model = onnx.load(path)
    mixed, report = convert(model)
    onnx.checker.check_model(mixed, full_check=True)
    assert report.range_check.startswith("measured")
    relative, new_nonfinite = _compare(model, mixed)
    assert not new_nonfinite, "the mixed model gives NaN/Inf where float32 does not"
    assert relative < REL_TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("path", LIGHT, ids=[os.path.basename(p) for p in LIGHT])
def test_light_model_with_random_weights_matches_fp32(path: str) -> None:
    model = randomize_weights(onnx.load(path))
    mixed, report = convert(model)
    onnx.checker.check_model(mixed, full_check=True)
    assert report.low_nodes >= 0.5 * report.candidates, report.summary()
    relative, new_nonfinite = _compare(model, mixed)
    assert not new_nonfinite
    assert relative < REL_TOLERANCE, f"relative error {relative:.3g}"
