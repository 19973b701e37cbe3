"""The adapters' registry: each adaptation's two halves are inverses. A model lowered by every
adapter (``adapters.lower``) and handed its lowered form's own weights back (``adapters.write_back``)
is the model as given, byte for byte (weights in Constant nodes, in ai.onnx.ml attributes, in
float16 and float32), or, for float64 weights, which train through their float32 view, as given to
float32's precision."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, numpy_helper

from amp_rewrite.training import adapters
from amp_rewrite.training.adapters import float32_view
from tests.test_training_attribute_weights import _regressor
from tests.test_training_constants import _constant_mlp
from tests.test_training_float32_view import _mlp


def _float64() -> onnx.ModelProto:
    return _mlp(TensorProto.DOUBLE)


@pytest.mark.parametrize("build", [_constant_mlp, lambda: _regressor(2), lambda: _mlp(TensorProto.FLOAT16),
                                   _float64, lambda: _mlp(TensorProto.FLOAT)],
                         ids=["constant nodes", "attributes", "float16", "float64", "float32"])
def test_writing_back_the_lowered_weights_gives_the_model_as_given(build) -> None:
    model = build()
    lowered = onnx.ModelProto.FromString(model.SerializeToString())
    adapters.lower(lowered)
    weights = {t.name: numpy_helper.to_array(t) for t in lowered.graph.initializer}
    assert lowered.SerializeToString() != model.SerializeToString()
    written = onnx.ModelProto.FromString(model.SerializeToString())
    adapters.write_back(written, weights)
    if build is not _float64:
        assert written.SerializeToString() == model.SerializeToString()
        return
    assert written.SerializeToString() != model.SerializeToString()  # float32's precision, in float64
    for either in (written, model):
        float32_view.lower(either)
    assert written.SerializeToString() == model.SerializeToString()


def test_every_adapter_has_both_halves() -> None:
    assert adapters.ADAPTERS and all(callable(a.lower) and callable(a.write_back) for a in adapters.ADAPTERS)
