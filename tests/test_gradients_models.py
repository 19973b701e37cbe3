"""Gradients of real architectures: onnx's light models (weights randomised) and the bundled
sample models. For weights near the input, in the middle and near the output, the gradient
of a scalar loss on the model's output matches a finite difference along a random direction
(ONNX Runtime, float32); every gradient graph passes the full checker."""

from __future__ import annotations

import os

import onnx
import pytest

from amp_rewrite.inputs import samples
from amp_rewrite.training import gradient_model
from models import builders
from models.light import LIGHT, feed, randomize_weights
from tests.gradcheck import directional_check, spread_weights, with_loss

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("path", LIGHT, ids=lambda p: os.path.basename(p).removeprefix("light_").removesuffix(".onnx"))
def test_light_model_gradients(path: str) -> None:
    model = randomize_weights(onnx.load(path))
    feeds = feed(model)
    model = with_loss(model, feeds)
    directional_check(model, feeds, spread_weights(model))


@pytest.mark.parametrize("name", sorted(builders.SAMPLES))
def test_sample_model_gradients(name: str) -> None:
    model = builders.SAMPLES[name]()
    feeds = samples.generate(model, 1, None, 0)[0]
    model = with_loss(model, feeds)
    grad = directional_check(model, feeds, spread_weights(model))
    assert {o.name for o in model.graph.output} < {o.name for o in grad.graph.output}


def test_default_wrt_is_every_float_weight_the_loss_reads() -> None:
    model = builders.mlp()
    feeds = samples.generate(model, 1, None, 0)[0]
    model = with_loss(model, feeds)
    grad = gradient_model(model, "loss")
    weights = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT} - {"loss_weights"}
    outputs = {o.name for o in grad.graph.output}
    assert {f"{w}_grad" for w in weights} <= outputs
    assert "loss_weights_grad" in outputs  # the loss reads it too: it is a float initializer like the others
    shapes = {t.name: list(t.dims) for t in model.graph.initializer}
    for out in grad.graph.output:
        if out.name.endswith("_grad"):
            dims = [d.dim_value for d in out.type.tensor_type.shape.dim]
            assert dims == shapes[out.name.removesuffix("_grad")]
