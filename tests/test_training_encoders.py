"""Models that read strings train: the encoders of the string inputs (ai.onnx.ml OneHotEncoder,
LabelEncoder) run ahead of the step as a model of their own, the step reads the numbers they
make, and the trained model is the input model, strings and all, with the trained weights."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import numpy_helper

from amp_rewrite.cli import main
from amp_rewrite.errors import UserError
from amp_rewrite.ir import io
from amp_rewrite.training import build
from amp_rewrite.training.adapters.encoders import Encoding, split
from amp_rewrite.training.runner.trainer import Trainer
from amp_rewrite.training.step import save
from tests.gradcheck import ort_run
from tests.helpers import rng

COLOURS = ["red", "green", "blue"]
HEADER = '<ir_version: 8, opset_import: ["" : 17, "ai.onnx.ml" : 2]>'


def _with_weights(text: str, **shapes: tuple[int, ...]) -> onnx.ModelProto:
    """The model ``text`` describes, its float initializers ``shapes`` drawn at random."""
    model = onnx.parser.parse_model(f"{HEADER}\n{text}")
    model.graph.initializer.extend(numpy_helper.from_array(rng(len(name)).normal(0, 0.5, shape).astype(np.float32),
                                                           name) for name, shape in shapes.items())
    onnx.checker.check_model(model, full_check=True)
    return model


def _one_hot() -> onnx.ModelProto:
    """colour -> OneHotEncoder -> Reshape [N, 3], beside x -> Gemm: skl2onnx's ColumnTransformer."""
    return _with_weights("""
    g (float[N, 2] x, string[N, 1] colour) => (float[N, 2] y) <int64[2] shape = {-1, 3}> {
      hot = ai.onnx.ml.OneHotEncoder <cats_strings = ["red", "green", "blue"], zeros = 1> (colour)
      encoded = Reshape (hot, shape)
      features = Concat <axis = 1> (x, encoded)
      y = Gemm (features, w, b)
    }""", w=(5, 2), b=(2,))


def _label_encoded() -> onnx.ModelProto:
    """colour -> LabelEncoder (a float per colour), beside x -> MatMul."""
    return _with_weights("""
    g (float[N, 2] x, string[N, 1] colour) => (float[N, 2] y) {
      encoded = ai.onnx.ml.LabelEncoder <keys_strings = ["red", "green", "blue"], values_floats = [-1.0, 0.0, 1.0],
                                         default_float = 0.0> (colour)
      features = Concat <axis = 1> (x, encoded)
      y = MatMul (features, w)
    }""", w=(3, 2))


MODELS = {"one-hot": _one_hot, "label-encoded": _label_encoded}


def _data(n: int = 32) -> dict[str, np.ndarray]:
    """x, colour (numpy str, as an .npz holds it) and labels a linear model of both can learn."""
    x = rng(1).normal(0, 1, (n, 2)).astype(np.float32)
    colour = rng(2).choice(COLOURS, (n, 1))
    hot = (colour == np.array(COLOURS)).astype(np.float32)
    labels = x @ np.array([[1.0, -1.0], [0.5, 2.0]], np.float32) + hot @ np.array([[1, 0], [0, 1], [-1, 1]], np.float32)
    return {"x": x, "colour": colour, "labels": labels.astype(np.float32)}


@pytest.mark.parametrize("case", MODELS)
def test_the_encoder_makes_the_models_own_values_and_the_rest_computes_the_same(case):
    model, data = MODELS[case](), _data()
    rest = onnx.ModelProto.FromString(model.SerializeToString())
    encoder = split(rest, {t.name for t in rest.graph.initializer if t.data_type == onnx.TensorProto.FLOAT})
    assert encoder is not None and [o.name for o in encoder.graph.output] == ["encoded"]
    exposed = onnx.ModelProto.FromString(model.SerializeToString())
    exposed.graph.output.append(onnx.ValueInfoProto(name="encoded"))
    full = ort_run(exposed, {"x": data["x"], "colour": data["colour"]}, ["encoded", "y"])
    encoded = Encoding(encoder)({"colour": data["colour"]})["encoded"]
    np.testing.assert_array_equal(encoded, full["encoded"])
    onnx.checker.check_model(rest, full_check=True)
    assert [i.name for i in rest.graph.input] == ["x", "encoded"]
    assert not [n for n in rest.graph.node if n.domain == "ai.onnx.ml"]
    assert "shape" not in {t.name for t in rest.graph.initializer}, "a constant only the encoder reads goes with it"
    np.testing.assert_allclose(ort_run(rest, {"x": data["x"], "encoded": encoded}, ["y"])["y"], full["y"], rtol=1e-6)


def test_a_model_without_strings_comes_back_unchanged():
    model = _with_weights("g (float[N, 2] x) => (float[N, 2] y) { y = MatMul (x, w) }", w=(2, 2))
    before = model.SerializeToString()
    assert split(model, {"w"}) is None
    assert model.SerializeToString() == before


REFUSED = {"picked by a numeric input": "picked = Gather <axis = 1> (colour, index)",
           "after an encoder node": "same = Identity (colour)\n      picked = Gather <axis = 1> (same, index)"}


@pytest.mark.parametrize("case", REFUSED)
def test_a_string_read_with_numbers_is_refused_in_one_line(case):
    """Strings that a numeric input picks are no encoder's: the step would have to bind them."""
    model = _with_weights(f"""
    g (float[N, 2] x, string[N, 3] colour, int64[1] index) => (float[N, 2] y) <int64[2] shape = {{-1, 3}}> {{
      {REFUSED[case]}
      hot = ai.onnx.ml.OneHotEncoder <cats_strings = ["red", "green", "blue"], zeros = 1> (picked)
      encoded = Reshape (hot, shape)
      features = Concat <axis = 1> (x, encoded)
      y = MatMul (features, w)
    }}""", w=(5, 2))
    with pytest.raises(UserError, match=r"^input 'colour' holds strings, and Gather node .* reads them with numbers") \
            as caught:
        build(model, loss="mse", output="y", precision="float32")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("precision", ["float32", "float16"])
@pytest.mark.parametrize("case", MODELS)
def test_training_through_the_encoder_lowers_the_loss(case, precision):
    data = _data()
    step = build(MODELS[case](), loss="mse", output="y", precision=precision, range_data=[data])
    assert step.spec.strings == ["colour"] and step.spec.encoded == ["encoded"]
    assert "colour" not in step.spec.data and sorted(step.spec.given) == ["colour", "labels", "x"]
    trainer = Trainer(step, lr=0.05)
    before = trainer.evaluate(data)["loss"]
    trainer.fit(data, epochs=5, batch_size=8, progress=False)
    assert trainer.evaluate(data)["loss"] < 0.5 * before


def test_the_exported_model_reads_the_strings_and_matches_the_trained_forward(tmp_path):
    data = _data()
    step = build(_one_hot(), loss="mse", output="y", precision="float32")
    trainer = Trainer(step, lr=0.05)
    trainer.fit(data, epochs=2, batch_size=8, progress=False)
    io.save(trainer.exported(check_on=data), tmp_path / "trained.onnx", None)  # check_export runs it on the strings
    exported = onnx.load(tmp_path / "trained.onnx")
    assert [i.name for i in exported.graph.input] == ["x", "colour"]
    want = ort_run(trainer.with_weights(step.forward), dict(trainer.encoding(data)), ["y"])["y"]
    for colour in (data["colour"], data["colour"].astype(object)):
        got = ort_run(exported, {"x": data["x"], "colour": colour}, ["y"])["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_step_specialized_to_the_strings_extents_runs_in_graph_mode():
    data = _data()
    first = {name: array[:8] for name, array in data.items()}
    step = build(_one_hot(), loss="mse", output="y", precision="float32", range_data=[first],
                 specialize={name: array.shape for name, array in first.items()})
    assert step.spec.extents == {"x": [8, 2], "encoded": [8, 3], "labels": [8, 2]}
    trainer = Trainer(step, lr=0.05, graph_mode=True)
    before = trainer.evaluate(data)["loss"]
    trainer.fit(data, epochs=3, batch_size=8, progress=False)
    assert trainer.graph_mode and trainer.evaluate(data)["loss"] < before


def test_the_step_graph_is_written_with_its_encoder(tmp_path):
    step = build(_label_encoded(), loss="mse", output="y", precision="float32")
    save(step, tmp_path / "step.onnx")
    spec = json.loads((tmp_path / "step.onnx.json").read_text())
    assert spec["strings"] == ["colour"] and spec["encoded"] == ["encoded"] and "encoded" in spec["data"]
    encoder = onnx.load(tmp_path / "step.onnx.encoder.onnx")
    assert [i.name for i in encoder.graph.input] == ["colour"] and [o.name for o in encoder.graph.output] == ["encoded"]


def test_train_reads_string_columns_from_npz(tmp_path):
    path, data, out = tmp_path / "m.onnx", tmp_path / "train.npz", tmp_path / "t.onnx"
    onnx.save(_one_hot(), path)
    np.savez(data, **_data())
    assert main(["train", str(path), "--data", str(data), "--loss", "mse", "--output", "y", "--labels", "labels",
                 "--precision", "float16", "--epochs", "2", "--batch-size", "8", "--lr", "0.05", "-o", str(out),
                 "--quiet"]) == 0
    arrays = dict(np.load(data))
    mse = {model: float(np.mean((ort_run(onnx.load(model), {"x": arrays["x"], "colour": arrays["colour"]}, ["y"])["y"]
                                 - arrays["labels"]) ** 2)) for model in (path, out)}
    assert mse[out] < mse[path]
