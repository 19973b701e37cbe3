"""Fine-tuning a real architecture: onnx's light SqueezeNet (weights randomised; Dropout active,
its Softmax output reshaped to [N, 1000, 1, 1]) trains for a few steps with its loss going
down, in float16 (dynamic loss scaling: the first steps back the scale off) and float32."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from amp_rewrite.training import build
from amp_rewrite.training.runner.trainer import Trainer
from models.light import LIGHT, data_input, randomize_weights

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("precision", ["float32", "float16"])
def test_light_squeezenet_loss_goes_down(precision):
    model = randomize_weights(onnx.load(next(p for p in LIGHT if "squeezenet" in p)))
    data, output = data_input(model), model.graph.output[0]
    shape = [d.dim_value for d in data.type.tensor_type.shape.dim]
    classes_shape = [d.dim_value for d in output.type.tensor_type.shape.dim]
    step = build(model, loss="cross-entropy", output=output.name, optimizer="sgd", precision=precision)
    trainer = Trainer(step, lr=2e-4)
    batch = {data.name: np.random.default_rng(0).normal(0, 1, shape).astype(np.float32),
             "labels": np.full([shape[0], *classes_shape[2:]], 3)}
    results = [trainer.step(batch) for _ in range(10)]
    taken = [r.loss for r in results if not r.skipped]
    assert len(taken) >= 4, [(r.loss, r.scale, r.skipped) for r in results]
    assert taken[-1] < 0.5 * taken[0], taken
    if precision == "float16":
        assert step.report.low_nodes > 0.5 * step.report.candidates
