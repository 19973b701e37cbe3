"""Training on real data shipped with a package (scikit-learn's digits) through ``amp-rewrite
train``: an MLP and a small CNN shaped like the seed CNN reach the same test accuracy in
float16 as in float32 (within one point, averaged over the last three epochs)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from amp_rewrite.cli import main
from models import builders, digits

pytestmark = pytest.mark.slow

MODELS = {
    "mlp": (lambda: builders.mlp(features=64, hidden=64), "log_probs", False, 10, "1e-3"),
    "cnn": (lambda: builders.seed_cnn(image_size=8, channels=1, widths=(16, 32)), "probabilities", True, 12, "3e-3"),
}


def _train(tmp_path, name: str, precision: str) -> dict:
    build, output, image, epochs, lr = MODELS[name]
    folder = tmp_path / precision
    folder.mkdir()
    model = folder / "model.onnx"
    onnx.save(build(), model)
    train, test = digits.write(folder, "image" if image else "x", image=image)
    report = folder / "report.json"
    code = main(["train", str(model), "--data", train, "--eval", test, "--loss", "cross-entropy", "--output", output,
                 "--labels", "labels", "--optimizer", "adamw", "--lr", lr, "--epochs", str(epochs), "--batch-size",
                 "32", "--precision", precision, "-o", str(folder / "trained.onnx"), "--mixed-output",
                 str(folder / "trained.mixed.onnx"), "--report", str(report), "--quiet"])
    assert code == 0
    trained = onnx.load(folder / "trained.onnx")
    original = onnx.load(model)
    assert [n.op_type for n in trained.graph.node] == [n.op_type for n in original.graph.node]
    return json.loads(report.read_text())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_float16_reaches_float32_accuracy(tmp_path, name):
    results = {p: _train(tmp_path, name, p) for p in ("float32", "float16")}
    # the mean of the last epochs: the seed CNN learns its BatchNormalization statistics (it was never
    # trained), and one epoch's running statistics move the evaluation accuracy by about a point
    accuracy = {p: float(np.mean([e["eval"]["accuracy"] for e in r["epochs"][-3:]])) for p, r in results.items()}
    assert accuracy["float32"] > 0.9, accuracy
    assert abs(accuracy["float16"] - accuracy["float32"]) <= 0.01, accuracy
    assert results["float16"]["epochs"][-1]["loss"] < results["float16"]["epochs"][0]["loss"]
    assert results["float16"]["spec"]["precision"] == "float16"
