"""Gradient accumulation: ``accumulate`` micro-batches make the update one batch of them all
makes, the steps between change nothing but the sums, and an inf or NaN in any micro-batch
skips the whole window and backs the loss scale off once."""

from __future__ import annotations

import numpy as np
import pytest

from amp_rewrite.cli import main
from amp_rewrite.errors import UserError
from amp_rewrite.training import build
from amp_rewrite.training.runner.trainer import Trainer
from models import builders
from tests.helpers import rng


def _data(n: int = 8) -> dict[str, np.ndarray]:
    return {"x": rng(1).normal(0, 1, (n, 16)).astype(np.float32),
            "labels": rng(2).integers(0, 10, n).astype(np.int64)}


def _trainer(accumulate: int, precision: str = "float32", optimizer: str = "sgd") -> Trainer:
    step = build(builders.mlp(features=16, hidden=16), loss="cross-entropy", output="log_probs",
                 optimizer=optimizer, precision=precision, accumulate=accumulate)
    return Trainer(step, lr=0.1)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_micro_batches_make_the_update_of_their_union(optimizer) -> None:
    data = _data()
    whole, split = _trainer(1, optimizer=optimizer), _trainer(2, optimizer=optimizer)
    before = split.weights
    whole.step(data)
    split.step({k: v[:4] for k, v in data.items()})
    assert all(np.array_equal(split.weights[k], before[k]) for k in before)  # a window still summed
    assert float(split.value("step")) == 0.0 and float(split.value("micro_steps")) == 1.0
    split.step({k: v[4:] for k, v in data.items()})
    assert float(split.value("step")) == 1.0 and float(split.value("micro_steps")) == 0.0
    assert all(np.allclose(split.weights[k], whole.weights[k], rtol=1e-5, atol=1e-6) for k in before)
    assert sum(not np.array_equal(split.weights[k], before[k]) for k in before) >= len(before) - 1
    assert all(not split.value(f"{k}.grad_sum").any() for k in before)  # zeroed once applied


def test_an_inf_in_one_micro_batch_skips_the_window_and_backs_the_scale_off_once() -> None:
    trainer = _trainer(2, precision="float16", optimizer="adamw")
    data = _data()
    bad = {k: v[:4].copy() for k, v in data.items()}
    bad["x"][0, 0] = np.inf
    before, scale = trainer.weights, trainer.scale
    first = trainer.step(bad)
    assert not first.skipped and trainer.scale == scale  # the scale holds within a window
    second = trainer.step({k: v[4:] for k, v in data.items()})
    assert second.skipped and trainer.scale == scale / 2
    assert all(np.array_equal(trainer.weights[k], before[k]) for k in before)
    assert float(trainer.value("step")) == 0.0 and all(not trainer.value(f"{k}.grad_sum").any() for k in before)
    trainer.step({k: v[:4] for k, v in data.items()})
    assert not trainer.step({k: v[4:] for k, v in data.items()}).skipped  # the next window applies
    assert float(trainer.value("step")) == 1.0


def test_without_accumulation_the_step_carries_no_sums() -> None:
    roles = {c.role for c in _trainer(1).spec.carried}
    assert "grad_sum" not in roles and "micro_steps" not in roles
    with pytest.raises(UserError, match="--accumulate"):
        _trainer(0)


def test_train_accumulates_from_the_command_line(tmp_path) -> None:
    path, data, out = tmp_path / "m.onnx", tmp_path / "d.npz", tmp_path / "t.onnx"
    import onnx

    onnx.save(builders.mlp(features=16, hidden=16), path)
    np.savez(data, **_data(64))
    report = tmp_path / "r.json"
    assert main(["train", str(path), "--data", str(data), "--loss", "cross-entropy", "--output", "log_probs",
                 "--batch-size", "8", "--accumulate", "4", "--epochs", "2", "--lr", "1e-2", "-o", str(out),
                 "--report", str(report), "--quiet"]) == 0
    import json

    written = json.loads(report.read_text())
    assert written["steps"] == 16 and written["spec"]["accumulate"] == 4
    assert written["epochs"][-1]["loss"] < written["epochs"][0]["loss"]
