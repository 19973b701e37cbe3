"""``batchnorm="auto"`` (train's default): a model whose BatchNormalization statistics were
trained keeps them (fine-tuning); one whose statistics were never measured on data (their initial
values, or one placeholder value per tensor) learns them."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite.training import build
from amp_rewrite.training.graph.modes import batchnorm_mode
from tests.helpers import rng


def _conv_bn(mean: np.ndarray, var: np.ndarray, shared: bool = False) -> onnx.ModelProto:
    """x -> Conv -> BatchNormalization -> Relu -> y; ``shared``: the statistics are Identity nodes
    of the scale and bias initializers, as TorchScript writes a fresh model's equal tensors."""
    inits = [numpy_helper.from_array(rng(1).normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.ones(4, np.float32), "gamma"),
             numpy_helper.from_array(np.zeros(4, np.float32), "beta")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    if shared:
        nodes[:0] = [helper.make_node("Identity", ["beta"], ["mean"]), helper.make_node("Identity", ["gamma"], ["var"])]
    else:
        inits += [numpy_helper.from_array(mean, "mean"), numpy_helper.from_array(var, "var")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 6, 6])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


FRESH = (np.zeros(4, np.float32), np.ones(4, np.float32))
TRAINED = (np.array([0.2, -0.1, 0.05, 0.3], np.float32), np.array([1.7, 0.9, 1.2, 2.0], np.float32))
PLACEHOLDERS = (np.full(4, 0.2, np.float32), np.full(4, 1.7, np.float32))
"""One value per tensor, as onnx's light test models hold: statistics measured on data differ between channels."""


@pytest.mark.parametrize("model, mode", [
    (_conv_bn(*FRESH), "train"), (_conv_bn(*FRESH, shared=True), "train"), (_conv_bn(*TRAINED), "freeze"),
    (_conv_bn(TRAINED[0], FRESH[1]), "freeze"),  # one trained statistic is enough
    (_conv_bn(*PLACEHOLDERS), "train"), (_conv_bn(PLACEHOLDERS[0], TRAINED[1]), "freeze"),
])
def test_auto_freezes_trained_statistics_and_trains_initial_ones(model, mode) -> None:
    assert batchnorm_mode(model, "auto") == mode
    step = build(model, loss="mse", output="y", precision="float32")
    assert sorted(c.role for c in step.spec.carried if c.role.startswith("running")) == \
        (["running_mean", "running_var"] if mode == "train" else [])


def test_an_explicit_mode_wins() -> None:
    for given in ("train", "freeze"):
        assert batchnorm_mode(_conv_bn(*TRAINED), given) == given
        assert batchnorm_mode(_conv_bn(*FRESH), given) == given


def test_tiny_frozen_variances_leave_a_float16_step_finite() -> None:
    """Variances of 1e-12 (dead channels, as onnx's light DenseNet-121 holds) are frozen buffers,
    not parameters: descended on, their gradient's factor 1/(var + eps), 1e5 whatever the loss
    scale, overflowed that model's float16 backward on every step. The float16 step applies its
    updates once the scale has backed off."""
    from amp_rewrite.training.runner.trainer import Trainer

    var = np.array([1e-12, 0.9, 1e-12, 2.0], np.float32)
    step = build(_conv_bn(TRAINED[0], var), loss="mse", output="y", precision="float16")
    assert {c.input for c in step.spec.params} == {"w", "gamma", "beta"}
    trainer = Trainer(step, lr=1e-3)
    r = rng(2)
    batch = {"x": r.normal(0, 1, (4, 3, 6, 6)).astype(np.float32),
             "labels": r.normal(0, 1, (4, 4, 6, 6)).astype(np.float32)}
    results = [trainer.step(batch) for _ in range(24)]  # the first ones back the scale off from 2^16
    assert not any(result.skipped for result in results[-8:]) and results[-1].scale >= 1.0
    assert results[-1].loss < results[0].loss
