"""``ensure_opset``: ONNX's version converter, run without the weights' values."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import version_converter

from amp_rewrite.ir.opsets import default_opset, ensure_opset
from amp_rewrite.runtime import instrument
from tests.helpers import model, rng, run


def _old_model() -> onnx.ModelProto:
    """Opset 6: Add's and Gemm's legacy broadcast attribute, which opset 7 dropped (the converter
    rewrites both nodes), over weights larger than ``SMALL_TENSOR``."""
    return model("""(float[4,16] x) => (float[4,16] r) {
        y = MatMul(x, w)
        z = Add<broadcast=1>(y, b)
        r = Gemm<broadcast=1>(z, w, b) }""",
                 {"w": rng().normal(size=(16, 16)).astype(np.float32),
                  "b": rng(1).normal(size=(16,)).astype(np.float32)}, opset=6)


def test_the_upgrade_is_the_converter_s_own_with_the_weights_put_back() -> None:
    m = _old_model()
    before = m.SerializeToString()
    upgraded = ensure_opset(m, 16)
    assert m.SerializeToString() == before  # the model passed in is left as it was
    assert default_opset(upgraded) == 16 and upgraded.ir_version >= 8
    expected = version_converter.convert_version(m, 16)
    expected.ir_version = upgraded.ir_version
    assert upgraded.SerializeToString() == expected.SerializeToString()
    assert all(a.name != "broadcast" for n in upgraded.graph.node for a in n.attribute)
    weights = {t.name: t.SerializeToString() for t in m.graph.initializer}
    assert all(weights[t.name] == t.SerializeToString() for t in upgraded.graph.initializer if t.name in weights)
    onnx.checker.check_model(upgraded, full_check=True)
    x = rng(2).normal(size=(4, 16)).astype(np.float32)
    np.testing.assert_allclose(run(upgraded, x=x)[0], run(m, x=x)[0], rtol=1e-6)


def test_a_model_at_the_opset_already_is_returned_as_it_is() -> None:
    m = _old_model()
    assert ensure_opset(m, 6) is m


def test_a_per_channel_prelu_slope_stays_on_the_channels() -> None:
    """PRelu-6 applies a slope of C elements along axis 1; from opset 7 it would broadcast against
    the last axis (here of extent C too: the converter alone silently changes the function)."""
    slope = np.array([0.1, 0.2, 0.3], np.float32)
    m = model("(float[2,3,4,3] x) => (float[2,3,4,3] y) { y = PRelu(x, s) }", {"s": slope}, opset=6)
    x = rng().normal(size=(2, 3, 4, 3)).astype(np.float32)
    expected = np.where(x > 0, x, x * slope.reshape(3, 1, 1))
    plain = version_converter.convert_version(m, 7)
    assert not np.allclose(instrument.session(plain).run(None, {"x": x})[0], expected)
    for target in (7, 16):
        upgraded = ensure_opset(m, target)
        assert [list(t.dims) for t in upgraded.graph.initializer] == [[3, 1, 1]]
        onnx.checker.check_model(upgraded, full_check=True)
        np.testing.assert_allclose(instrument.session(upgraded).run(None, {"x": x})[0], expected, rtol=1e-6)
        np.testing.assert_allclose(run(upgraded, x=x)[0], expected, rtol=1e-6)


def test_a_slope_another_op_reads_is_left_as_it_is() -> None:
    m = model("(float[2,3,4,3] x) => (float[2,3,4,3] y) { p = PRelu(x, s)  y = Add(p, s) }",
              {"s": np.array([0.1, 0.2, 0.3], np.float32)}, opset=6)
    assert [list(t.dims) for t in ensure_opset(m, 7).graph.initializer] == [[3]]
