"""The training workflows from Python: ``amp_rewrite.train`` and ``amp_rewrite.training_step``
take options objects (checked where they are made), return what they were given (a path, a
ModelProto, an onnx_ir Model), never edit their argument, and train in a ``multiprocessing.Pool``
worker as in the main process."""

from __future__ import annotations

import json
import multiprocessing

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import numpy_helper

import amp_rewrite
from amp_rewrite import FitOptions, StepOptions, TrainReport, UserError, train, training_step
from amp_rewrite.runtime import instrument
from amp_rewrite.training import build
from models import builders

pytestmark = pytest.mark.xdist_group("processes")

STEP = StepOptions(loss="cross-entropy", output="log_probs", optimizer="adamw", precision="float16")
FIT = FitOptions(epochs=3, batch_size=16, lr=3e-3, progress=False)


def _mlp() -> onnx.ModelProto:
    return builders.mlp(features=8, hidden=16, classes=3, layers=2)


def _data(count: int = 96, seed: int = 0) -> dict[str, np.ndarray]:
    """Three classes the first two features separate."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((count, 8)).astype(np.float32)
    labels = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5)
    return {"x": x, "labels": labels}


def _mean_loss(model: onnx.ModelProto, data: dict[str, np.ndarray]) -> float:
    """The model's own cross-entropy on ``data``, from its log-probabilities (ONNX Runtime, float32)."""
    (log_probs,) = instrument.session(model).run(["log_probs"], {"x": data["x"]})
    return float(-np.mean(log_probs[np.arange(len(data["labels"])), data["labels"]]))


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def test_a_model_proto_trains_into_a_model_proto_with_the_graph_unchanged_and_its_loss_lower() -> None:
    """The returned model is the given graph with other weights, and its own loss on the data
    (measured here) fell from the untrained model's; the argument is untouched."""
    model, data = _mlp(), _data()
    before = model.SerializeToString()
    trained, report = train(model, data, STEP, FIT)
    assert model.SerializeToString() == before
    assert isinstance(trained, onnx.ModelProto) and isinstance(report, TrainReport)
    assert [n.SerializeToString() for n in trained.graph.node] == [n.SerializeToString() for n in model.graph.node]
    assert any(not np.array_equal(w, _weights(model)[name]) for name, w in _weights(trained).items())
    assert _mean_loss(trained, data) < 0.9 * _mean_loss(model, data)
    assert [e["epoch"] for e in report.epochs] == [1, 2, 3] and report.steps == 3 * 6
    assert report.lr == 3e-3 and report.spec.precision == "float16" and report.schedule.total == 18


def test_paths_in_paths_out_with_the_mixed_model_and_the_report(tmp_path) -> None:
    source = tmp_path / "m.onnx"
    onnx.save(_mlp(), source)
    np.savez(tmp_path / "train.npz", **_data())
    result, report = train(source, tmp_path / "train.npz", STEP, FIT, eval_data=_data(32, seed=1),
                           output=tmp_path / "t.onnx", mixed_output=tmp_path / "t.mixed.onnx")
    assert result == tmp_path / "t.onnx"
    onnx.checker.check_model(str(result), full_check=True)
    mixed = onnx.load(str(tmp_path / "t.mixed.onnx"))
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in mixed.graph.initializer)
    assert report.mixed is not None and report.mixed.low_nodes > 0
    assert set(report.epochs[-1]["eval"]) == {"loss", "accuracy"}
    written = json.loads(report.to_json())
    assert written["steps"] == report.steps and written["spec"]["loss_kind"] == "cross-entropy"


def test_an_onnx_ir_model_trains_into_an_onnx_ir_model() -> None:
    trained, _ = train(ir.serde.deserialize_model(_mlp()), _data(), STEP, FitOptions(epochs=1, progress=False))
    assert isinstance(trained, ir.Model)


def test_the_step_notes_reach_the_caller_before_training() -> None:
    """A cnn with BatchNormalization statistics never measured: the warning comes as a note."""
    model = builders.seed_cnn(image_size=8, classes=3)
    rng = np.random.default_rng(0)
    data = {"image": rng.standard_normal((8, 3, 8, 8)).astype(np.float32), "labels": np.arange(8) % 3}
    heard: list[str] = []
    _, report = train(model, data, StepOptions(loss="cross-entropy", output=model.graph.output[0].name,
                                               batchnorm="train", precision="float32"),
                      FitOptions(epochs=1, batch_size=8, progress=False), notes=heard.append)
    assert any("never measured on data" in note for note in heard) and heard == report.notes


def test_training_step_writes_the_step_that_build_makes(tmp_path) -> None:
    step = training_step(_mlp(), STEP, output_graph=tmp_path / "step.onnx")
    assert (tmp_path / "step.onnx").read_bytes() == step.model.SerializeToString()
    assert json.loads((tmp_path / "step.onnx.json").read_text())["optimizer"] == "adamw"
    assert set(np.load(tmp_path / "step.onnx.init.npz")) == {c.input for c in step.spec.carried}
    same = training_step(_mlp(), loss="cross-entropy", output="log_probs", optimizer="adamw")
    assert same.model.SerializeToString() == build(_mlp(), STEP).model.SerializeToString() \
        == step.model.SerializeToString()


@pytest.mark.parametrize("make, message", [
    (lambda: StepOptions(precision="float8"), "unknown precision"),
    (lambda: StepOptions(optimizer="lamb"), "unknown optimizer"),
    (lambda: StepOptions(accumulate=0), "at least 1"),
    (lambda: StepOptions(loss="mse"), "needs the model output"),
    (lambda: StepOptions(params="w"), "a list of names"),
    (lambda: StepOptions(loss_scale="sometimes"), "--loss-scale must be"),
    (lambda: StepOptions(conv_weight_grad="fft"), "is not one of"),
    (lambda: FitOptions(epochs=0), "at least 1"),
    (lambda: FitOptions(graph_mode="sometimes"), "graph_mode must be one of"),
    (lambda: training_step(_mlp(), STEP, loss="mse"), "either options= or option keywords"),
    (lambda: training_step(_mlp(), colour="red"), "unexpected keyword"),
    (lambda: train(_mlp(), _data(), STEP, FitOptions(keep_best=True)), "give --eval"),
    (lambda: train(_mlp(), [1, 2], STEP, FIT), "must be an .npz path"),
    (lambda: train(_mlp(), {"x": _data()["x"]}, STEP, FIT), "labels"),
])
def test_bad_options_and_data_raise_one_user_error(make, message) -> None:
    with pytest.raises(UserError, match=message):
        make()


def _train_in_worker(data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    trained, _ = amp_rewrite.train(_mlp(), data, STEP, FIT)
    return _weights(trained)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_pool_worker_trains_as_the_main_process_does(method) -> None:
    """A daemonic worker: the step's range check and shape probes run in children forked with
    ``os.fork``; the weights are those the main process trains (the same shuffles, the same runs)."""
    data = _data()
    here = _train_in_worker(data)
    with multiprocessing.get_context(method).Pool(1) as pool:
        there = pool.apply(_train_in_worker, (data,))
    assert set(there) == set(here)
    for name, weight in here.items():
        np.testing.assert_allclose(there[name], weight, rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_step_is_written_whole_or_not_at_all(tmp_path, monkeypatch) -> None:
    """The step graph, its description and its first values take their names together: where the
    graph cannot be written (after the others were), none is left behind."""
    from amp_rewrite.ir import files

    def full_disk(*args, **kwargs):
        raise UserError("cannot write step.onnx: No space left on device")

    monkeypatch.setattr(files, "writing", full_disk)
    with pytest.raises(UserError, match="No space left"):
        training_step(_mlp(), STEP, output_graph=tmp_path / "step.onnx")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    training_step(_mlp(), STEP, output_graph=tmp_path / "step.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step.onnx", "step.onnx.init.npz", "step.onnx.json"]


def test_the_trained_model_and_its_rewrite_are_written_both_or_neither(tmp_path, monkeypatch) -> None:
    from amp_rewrite.ir import files

    real = files.writing

    def mixed_fails(model, output, base_dir):
        if str(output).endswith(".mixed.onnx"):
            raise UserError(f"cannot write {output}: No space left on device")
        return real(model, output, base_dir)

    monkeypatch.setattr(files, "writing", mixed_fails)
    with pytest.raises(UserError, match="No space left"):
        train(_mlp(), _data(), STEP, FitOptions(epochs=1, progress=False), output=tmp_path / "t.onnx",
              mixed_output=tmp_path / "t.mixed.onnx")
    assert list(tmp_path.iterdir()) == []
