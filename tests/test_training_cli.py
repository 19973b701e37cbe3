"""``amp-rewrite train`` and ``train-graph``: outputs, and one line with exit 2 (nothing written)
for every kind of bad input."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite.cli import main
from models import builders
from tests.gradcheck import ort_run
from tests.helpers import rng
from tests.test_training_step import _mlp


@pytest.fixture()
def files(tmp_path):
    model = _mlp()
    argmax = helper.make_node("ArgMax", ["logits"], ["predicted"], axis=1, keepdims=0)
    model.graph.node.append(argmax)
    model.graph.output.append(helper.make_tensor_value_info("predicted", TensorProto.INT64, ["N"]))
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (40, 4)).astype(np.float32)
    data = tmp_path / "train.npz"
    np.savez(data, x=x, labels=(x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0))
    return tmp_path, path, data


def _train_args(path, data, out, *extra):
    return ["train", str(path), "--data", str(data), "--loss", "cross-entropy", "--output", "logits", "--labels",
            "labels", "-o", str(out), "--quiet", *extra]


def test_train_writes_the_trained_model_mixed_model_and_report(files):
    folder, path, data = files
    out, mixed, report = folder / "t.onnx", folder / "t.mixed.onnx", folder / "r.json"
    before = path.read_bytes()
    assert main(_train_args(path, data, out, "--epochs", "3", "--lr", "0.05", "--mixed-output", str(mixed),
                            "--report", str(report), "--eval", str(data))) == 0
    assert path.read_bytes() == before
    trained, original = onnx.load(out), onnx.load(path)
    assert [(n.op_type, list(n.input)) for n in trained.graph.node] == \
        [(n.op_type, list(n.input)) for n in original.graph.node]
    changed = [t.name for t, o in zip(trained.graph.initializer, original.graph.initializer)
               if not np.array_equal(numpy_helper.to_array(t), numpy_helper.to_array(o))]
    assert changed == ["w1", "b1", "w2", "b2"]
    low = [n for n in onnx.load(mixed).graph.initializer if n.data_type == TensorProto.FLOAT16]
    assert low, "the mixed model holds float16 weights"
    result = json.loads(report.read_text())
    assert [e["epoch"] for e in result["epochs"]] == [1, 2, 3]
    assert result["epochs"][-1]["loss"] < result["epochs"][0]["loss"]
    assert "accuracy" in result["epochs"][-1]["eval"] and len(result["scales"]) == result["steps"] == 6
    assert result["skipped_steps"] == []


def test_train_graph_writes_a_step_a_description_and_first_values(files):
    folder, path, _ = files
    step = folder / "step.onnx"
    assert main(["train-graph", str(path), "--loss", "cross-entropy", "--output", "logits", "--optimizer", "sgd",
                 "-o", str(step), "--quiet"]) == 0
    graph = onnx.load(step)
    onnx.checker.check_model(graph, full_check=True)
    spec = json.loads((folder / "step.onnx.json").read_text())
    initial = dict(np.load(folder / "step.onnx.init.npz"))
    assert spec["data"] == ["x", "labels"] and spec["optimizer"] == "sgd"
    assert set(initial) == {c["input"] for c in spec["carried"]}
    feeds = {**initial, "x": np.ones((2, 4), np.float32), "labels": np.array([0, 2]), "lr": np.array(0.1, np.float32),
             "weight_decay": np.array(0.0, np.float32)}
    out = ort_run(graph, feeds, [spec["loss"], spec["skipped"]])
    assert np.isfinite(out[spec["loss"]]) and not out[spec["skipped"]]


def _det_model(folder):
    w = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Det", ["h"], ["d"]),
             helper.make_node("Unsqueeze", ["d", "axis"], ["logits"])]
    graph = helper.make_graph(nodes, "det", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 4])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 1])],
                              [w, numpy_helper.from_array(np.array([1], np.int64), "axis")])
    path = folder / "det.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    data = folder / "det.npz"
    np.savez(data, x=np.ones((4, 4, 4), np.float32), labels=np.zeros((4, 1), np.float32))
    return path, data


@pytest.mark.parametrize("case, message", [
    ("labels missing", "has no array for labels"),
    ("labels wrong shape", "array 'labels' has shape [40, 2]"),
    ("lengths disagree", "disagree in length"),
    ("labels out of range", "labels must be class indices in [0, 3)"),
    ("output not float", "'predicted' is not a float tensor"),
    ("no gradient rule", "no gradient rule for Det"),
    ("bad loss scale", "--loss-scale must be dynamic, none or a number"),
    ("provider option without a value", "--provider-option takes KEY=VALUE, got 'device_id'"),
])
def test_train_user_errors_are_one_line_and_write_nothing(files, capsys, case, message):
    folder, path, data = files
    x = np.load(data)["x"]
    labels = np.load(data)["labels"]
    bad = folder / "bad.npz"
    args = None
    if case == "labels missing":
        np.savez(bad, x=x)
    elif case == "labels wrong shape":
        np.savez(bad, x=x, labels=np.stack([labels, labels], 1))
    elif case == "lengths disagree":
        np.savez(bad, x=x, labels=labels[:10])
    elif case == "labels out of range":
        np.savez(bad, x=x, labels=labels + 5)
    elif case == "output not float":
        np.savez(bad, x=x, labels=labels)
        args = _train_args(path, bad, folder / "t.onnx")
        args[args.index("logits")] = "predicted"
    elif case == "no gradient rule":
        path, bad = _det_model(folder)
        args = ["train", str(path), "--data", str(bad), "--loss", "mse", "--output", "logits", "-o",
                str(folder / "t.onnx"), "--quiet"]
    elif case == "provider option without a value":
        np.savez(bad, x=x, labels=labels)
        args = _train_args(path, bad, folder / "t.onnx", "--provider-option", "device_id")
    else:
        np.savez(bad, x=x, labels=labels)
        args = _train_args(path, bad, folder / "t.onnx", "--loss-scale", "lots")
    code = main(args or _train_args(path, bad, folder / "t.onnx", "--mixed-output", str(folder / "t.mixed.onnx")))
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.count("\n") == 0 and message in err, err
    assert not (folder / "t.onnx").exists() and not (folder / "t.mixed.onnx").exists()


def _summed(folder):
    """logits = Gemm(x + z): x and z share the dimension name S, which data may not honour."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "z"], ["s"]), helper.make_node("Gemm", ["s", "w"], ["logits"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "S"]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", "S"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(np.ones((4, 3), np.float32), "w")])
    path = folder / "summed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.mark.parametrize("case, message", [
    ("scalar array", "bad.npz: array 'x' has shape []; the model expects ['N', 4]"),  # fed whole, as 0-d arrays are
    ("data the model cannot run", "onnxruntime cannot run the training step on CPUExecutionProvider"),
])
def test_train_refuses_what_it_cannot_take_in_one_line(files, capsys, case, message):
    """Each of these ended in an internal error on a real model (a scalar flag input, data
    whose extents a shared dimension name forbids)."""
    folder, path, data = files
    bad = folder / "bad.npz"
    labels = np.load(data)["labels"]
    if case == "scalar array":
        np.savez(bad, x=np.array(1.0, np.float32), labels=labels)
    else:
        path = _summed(folder)
        np.savez(bad, x=np.ones((40, 4), np.float32), z=np.ones((40, 5), np.float32), labels=labels)
    assert main(_train_args(path, bad, folder / "t.onnx", "--precision", "float32")) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err, err
    assert not (folder / "t.onnx").exists()


def test_a_model_with_an_output_named_loss_gets_its_standard_loss_under_another_name(files):
    folder, path, data = files
    model = onnx.load(path)
    model.graph.node.append(helper.make_node("ReduceMean", ["logits"], ["loss"], keepdims=0))
    model.graph.output.append(helper.make_tensor_value_info("loss", TensorProto.FLOAT, []))
    onnx.save(model, path)
    assert main(_train_args(path, data, folder / "t.onnx", "--epochs", "1")) == 0
    assert [o.name for o in onnx.load(folder / "t.onnx").graph.output] == [o.name for o in model.graph.output]


def _trained_weights(path) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}


def test_a_resumed_run_ends_where_the_whole_run_ends(files):
    """Checkpoints hold the weights, the optimizer's moments, the scale and the step count; the
    shuffling of the epochs already done is drawn again, so epochs 3-4 resumed from epoch 2's
    checkpoint are those of a run of 4."""
    folder, path, data = files
    common = ["--epochs", "4", "--lr", "0.01", "--precision", "float16", "--schedule", "cosine",
              "--warmup-steps", "2", "--clip-norm", "1.0"]
    assert main(_train_args(path, data, folder / "whole.onnx", *common, "--checkpoint-dir", str(folder / "c"))) == 0
    assert sorted(p.name for p in (folder / "c").iterdir()) == [f"epoch-{i}.npz" for i in range(1, 5)]
    assert main(_train_args(path, data, folder / "resumed.onnx", *common, "--resume",
                            str(folder / "c" / "epoch-2.npz"))) == 0
    whole, resumed = _trained_weights(folder / "whole.onnx"), _trained_weights(folder / "resumed.onnx")
    assert all(np.allclose(whole[k], resumed[k], atol=1e-6) for k in whole)
    assert not all(np.array_equal(whole[k], _trained_weights(path)[k]) for k in whole)
    assert main(_train_args(path, data, folder / "x.onnx", *common, "--resume", str(folder / "c" / "epoch-4.npz"))) \
        == 2


def test_keep_best_exports_the_epoch_of_the_lowest_evaluation_loss(files, tmp_path):
    folder, path, data = files
    report = folder / "r.json"
    assert main(_train_args(path, data, folder / "t.onnx", "--epochs", "4", "--lr", "0.5", "--optimizer", "sgd",
                            "--eval", str(data), "--keep-best", "--report", str(report))) == 0
    found = json.loads(report.read_text())
    losses = [e["eval"]["loss"] for e in found["epochs"]]
    assert found["best_epoch"] == 1 + int(np.argmin(losses))


def test_a_folder_of_npy_files_is_data_read_memory_mapped(files):
    folder, path, data = files
    arrays = np.load(data)
    (folder / "npy").mkdir()
    for name in arrays.files:
        np.save(folder / "npy" / f"{name}.npy", arrays[name])
    assert main(_train_args(path, folder / "npy", folder / "a.onnx", "--epochs", "2", "--lr", "0.01")) == 0
    assert main(_train_args(path, data, folder / "b.onnx", "--epochs", "2", "--lr", "0.01")) == 0
    a, b = _trained_weights(folder / "a.onnx"), _trained_weights(folder / "b.onnx")
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_the_default_learning_rate_is_gentle_enough_for_a_pretrained_model(files, capsys):
    folder, path, data = files
    report = folder / "r.json"
    assert main(_train_args(path, data, folder / "t.onnx", "--report", str(report))) == 0
    assert json.loads(report.read_text())["lr"] == 1e-5


def _stateful(folder):
    """out[N,3] = x[N,4] @ w + rate * mean over layers of state[2,N,3]: a recurrent state with its
    samples on axis 1 and a scalar input (a sample rate)."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["z"]), helper.make_node("ReduceMean", ["state"], ["s"], axes=[0],
                                                                            keepdims=0),
         helper.make_node("Mul", ["s", "rate"], ["r"]), helper.make_node("Add", ["z", "r"], ["out"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "N", 3]),
         helper.make_tensor_value_info("rate", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(np.zeros((4, 3), np.float32), "w")])
    path = folder / "stateful.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return path


def test_inputs_with_samples_on_another_axis_and_inputs_fed_whole(tmp_path):
    path = _stateful(tmp_path)
    x = np.random.default_rng(0).normal(0, 1, (40, 4)).astype(np.float32)
    state = np.random.default_rng(1).normal(0, 1, (2, 40, 3)).astype(np.float32)
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    labels = x @ w + 0.5 * state.mean(0)  # learnable exactly only where each sample meets its own state
    np.savez(tmp_path / "d.npz", x=x, state=state, rate=np.array(0.5, np.float32), labels=labels)
    args = ["train", str(path), "--data", str(tmp_path / "d.npz"), "--loss", "mse", "--output", "out", "--labels",
            "labels", "--optimizer", "sgd", "--lr", "0.1", "--epochs", "30", "--batch-size", "8", "--precision",
            "float32", "-o", str(tmp_path / "t.onnx"), "--quiet"]
    assert main([*args, "--batch-axis", "state:1"]) == 0
    trained = numpy_helper.to_array(onnx.load(tmp_path / "t.onnx").graph.initializer[0])
    assert np.allclose(trained, w, atol=0.05), trained
    assert main([*args, "--batch-axis", "state:3"]) == 2
    assert main([*args, "--batch-axis", "nothing:1"]) == 2


def test_a_model_with_a_fixed_batch_of_one_trains_and_its_loss_is_checked_at_that_batch(files):
    """onnx's light models declare batch 1: the loss check ran 32 samples at once and was refused."""
    folder, path, data = files
    model = onnx.load(path)
    for info in (*model.graph.input, *model.graph.output):
        info.type.tensor_type.shape.dim[0].ClearField("dim_param")
        info.type.tensor_type.shape.dim[0].dim_value = 1
    onnx.save(model, path)
    assert main(_train_args(path, data, folder / "t.onnx", "--batch-size", "1", "--lr", "0.01",
                            "--precision", "float32")) == 0


@pytest.mark.parametrize("fresh", [True, False], ids=["initial-statistics", "calibrated"])
def test_a_model_whose_batchnorm_statistics_were_never_calibrated_is_warned_of(tmp_path, capsys, fresh):
    """Running statistics at their initial values (means 0, variances 1: a model exported before
    it saw data) are replaced by training: one warning says so and names --batchnorm freeze."""
    model = builders.seed_cnn(image_size=16, widths=(4, 4))
    for tensor in model.graph.initializer:
        for node in (n for n in model.graph.node if n.op_type == "BatchNormalization"):
            if tensor.name in node.input[3:5]:  # fresh: 0 and 1; else as measured on data, per channel
                value = (0.0 if tensor.name == node.input[3] else 1.0) if fresh else \
                    np.linspace(0.5, 1.5, tensor.dims[0], dtype=np.float32)
                tensor.CopyFrom(numpy_helper.from_array(np.full(tensor.dims, value, np.float32), tensor.name))
    path, data = tmp_path / "m.onnx", tmp_path / "d.npz"
    onnx.save(model, path)
    np.savez(data, image=rng(1).normal(0, 1, (8, 3, 16, 16)).astype(np.float32), labels=np.arange(8) % 10)
    assert main(["train", str(path), "--data", str(data), "--loss", "cross-entropy", "--output", "probabilities",
                 "--batch-size", "4", "--precision", "float32", "-o", str(tmp_path / "t.onnx"), "--quiet"]) == 0
    warned = "running statistics were never measured on data" in capsys.readouterr().err
    assert warned == fresh
