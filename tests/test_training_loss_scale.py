"""Loss scaling matters: with a loss small enough that float16 gradients underflow, training
without a loss scale leaves most gradient elements at zero (AdamW then moves no weight) and
stalls, while dynamic loss scaling trains as float32 does."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from amp_rewrite.inputs.samples import read_npz
from amp_rewrite.training import build
from amp_rewrite.training.graph.losses import attach_loss
from amp_rewrite.training.runner.trainer import Trainer
from models import builders, digits

pytestmark = pytest.mark.slow
TINY = 1e-6
"""The loss's factor: most gradients of float16 activations fall below float16's smallest subnormal (6e-8)."""


def _tiny_loss_model() -> onnx.ModelProto:
    model = builders.mlp(features=64, hidden=64)
    attach_loss(model, "cross-entropy", "log_probs", "labels")
    model.graph.initializer.append(numpy_helper.from_array(np.array(TINY, np.float32), "tiny"))
    model.graph.node.append(helper.make_node("Mul", ["loss", "tiny"], ["tiny_loss"]))
    model.graph.output.append(helper.make_tensor_value_info("tiny_loss", onnx.TensorProto.FLOAT, []))
    return model


def _train(tmp_path, precision: str, loss_scale: str | None) -> tuple[float, float, float]:
    """(share of weight elements that never moved, first epoch's mean loss / TINY, last's)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    train_path, _ = digits.write(tmp_path)
    data = read_npz(train_path)
    step = build(_tiny_loss_model(), loss="tiny_loss", params=["w", "w_1", "w_2", "w_3", "w_4", "w_5", "w_6"],
                 optimizer="adamw", precision=precision, loss_scale=loss_scale)
    trainer = Trainer(step, lr=1e-3)
    before = {k: v.copy() for k, v in trainer.weights.items()}
    history = trainer.fit(data, epochs=3, batch_size=32, progress=False)
    after = trainer.weights
    still = sum(int(np.sum(after[k] == before[k])) for k in before) / sum(v.size for v in before.values())
    return still, history.epochs[0]["loss"] / TINY, history.epochs[-1]["loss"] / TINY


def test_without_loss_scaling_float16_gradients_underflow_and_training_stalls(tmp_path):
    names = [t.name for t in builders.mlp(features=64, hidden=64).graph.initializer]
    assert names == ["w", "w_1", "w_2", "w_3", "w_4", "w_5", "w_6"]  # the parameters trained above
    reference = _train(tmp_path / "fp32", "float32", None)
    unscaled = _train(tmp_path / "none", "float16", "none")
    dynamic = _train(tmp_path / "dynamic", "float16", "dynamic")
    # Weights that never move in float32 read the digits' always-blank border pixels (about 11%).
    assert reference[0] < 0.2 and dynamic[0] == pytest.approx(reference[0], abs=0.01)
    assert unscaled[0] > 0.5, f"only {unscaled[0]:.0%} of weights never moved"  # most gradients were zero
    assert unscaled[2] > 0.9 * unscaled[1]  # the loss stalls
    assert reference[2] < 0.8 * reference[1]  # it falls in float32,
    assert dynamic[2] == pytest.approx(reference[2], rel=0.02)  # and as much with dynamic scaling
