"""``ensure_opset``: ONNX's version converter, run without the weights' values."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import version_converter

from amp_rewrite.ir.opsets import default_opset, ensure_opset
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
