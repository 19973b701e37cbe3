"""The training step graph: optimizer math against a numpy reference of PyTorch's semantics,
skipped steps on inf/NaN gradients, the dynamic scale's backoff and growth."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_rewrite.errors import UserError
from amp_rewrite.ir import io
from amp_rewrite.runtime import instrument
from amp_rewrite.runtime.step_session import StepSession
from amp_rewrite.training import LossScale, attach_loss, build
from amp_rewrite.training.runner.trainer import Trainer


def _mlp(seed: int = 0) -> onnx.ModelProto:
    """x[N,4] -> Gemm(8) -> Relu -> Gemm(3) -> logits."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, s).astype(np.float32), n)
             for n, s in (("w1", (4, 8)), ("b1", (8,)), ("w2", (8, 3)), ("b2", (3,)))]
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["logits"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _batch(seed: int = 1, n: int = 6):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(0, 1, (n, 4)).astype(np.float32), "labels": rng.integers(0, 3, n).astype(np.int64)}


def _numpy_loss_grads(weights, batch):
    """Cross-entropy of the MLP and its gradients, in float64."""
    x, y = batch["x"].astype(np.float64), batch["labels"]
    w1, b1, w2, b2 = (weights[k].astype(np.float64) for k in ("w1", "b1", "w2", "b2"))
    h = x @ w1 + b1
    r = np.maximum(h, 0)
    z = r @ w2 + b2
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    n = len(y)
    loss = -np.mean(np.log(p[np.arange(n), y]))
    dz = p.copy()
    dz[np.arange(n), y] -= 1
    dz /= n
    dr = dz @ w2.T
    dh = dr * (h > 0)
    return loss, {"w1": x.T @ dh, "b1": dh.sum(0), "w2": r.T @ dz, "b2": dz.sum(0)}


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_float32_steps_match_pytorch_semantics(opt):
    step = build(_mlp(), loss="cross-entropy", output="logits", optimizer=opt, precision="float32",
                 loss_scale="none")
    onnx.checker.check_model(step.model, full_check=True)
    lr, wd = 0.1, 0.01
    trainer = Trainer(step, lr=lr, weight_decay=wd)
    weights = {k: v.astype(np.float64) for k, v in step.initial.items() if k in ("w1", "b1", "w2", "b2")}
    state = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in weights.items()}
    for t in range(1, 4):
        batch = _batch(seed=t)
        loss, grads = _numpy_loss_grads(weights, batch)
        result = trainer.step(batch)
        assert result.loss == pytest.approx(loss, rel=1e-5)
        for k, g in grads.items():
            m, v = state[k]
            if opt == "sgd":  # torch.optim.SGD(momentum=0.9, weight_decay=wd)
                g = g + wd * weights[k]
                m = 0.9 * m + g
                weights[k] = weights[k] - lr * m
            else:  # torch.optim.AdamW(betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)
                weights[k] = weights[k] * (1 - lr * wd)
                m = 0.9 * m + 0.1 * g
                v = 0.999 * v + 0.001 * g * g
                denom = np.sqrt(v / (1 - 0.999**t)) + 1e-8
                weights[k] = weights[k] - lr / (1 - 0.9**t) * m / denom
            state[k] = (m, v)
        for k in weights:
            np.testing.assert_allclose(trainer.value(k), weights[k], rtol=2e-5, atol=1e-5, err_msg=f"{opt} {k} {t}")
    assert trainer.value("step") == 3


def test_a_batch_put_on_the_device_once_trains_as_the_same_batch_given_each_step():
    step = build(_mlp(), loss="cross-entropy", output="logits", optimizer="adamw", precision="float32",
                 loss_scale="none")
    given, placed = Trainer(step, lr=0.1), Trainer(step, lr=0.1)
    batch = _batch()
    on_device = placed.device_batch(batch)
    for _ in range(3):
        assert placed.step(on_device).loss == given.step(batch).loss
    assert np.array_equal(placed.value("w1"), given.value("w1"))
    assert not np.array_equal(placed.value("w1"), step.initial["w1"])


@pytest.mark.parametrize("provider, given, expected", [
    ("CUDAExecutionProvider", {"device_id": "1"}, {"arena_extend_strategy": "kSameAsRequested", "device_id": "1"}),
    ("CUDAExecutionProvider", {"arena_extend_strategy": "kNextPowerOfTwo"},
     {"arena_extend_strategy": "kNextPowerOfTwo"}),
    ("CPUExecutionProvider", None, {}),
])
def test_provider_options_reach_the_session_over_the_defaults(monkeypatch, provider, given, expected):
    from amp_rewrite.runtime import instrument

    step = build(_mlp(), loss="cross-entropy", output="logits", optimizer="sgd")
    opened = {}

    def session(model, base_dir, where, **kwargs):  # records, then opens the step on the CPU
        opened.update(kwargs["provider_options"])
        return real(model, base_dir, "CPUExecutionProvider", optimize=kwargs["optimize"])

    real = instrument.session
    monkeypatch.setattr(instrument, "session", session)
    monkeypatch.setattr(StepSession, "device_value", lambda self, array: array)
    trainer = Trainer(step, provider=provider, provider_options=given)
    assert opened == expected
    assert trainer.session.device_id == int(expected.get("device_id", 0))


def test_inf_gradient_skips_the_step_and_halves_the_scale():
    step = build(_mlp(), loss="cross-entropy", output="logits", optimizer="adamw", precision="float16")
    trainer = Trainer(step, lr=0.01)
    trainer.step(_batch())  # one clean step so the moments are not all zero
    before = {c.input: trainer.value(c.input).copy() for c in step.spec.carried}
    poisoned = _batch(seed=2)
    poisoned["x"][0, 0] = np.inf
    result = trainer.step(poisoned)
    assert result.skipped
    for c in step.spec.carried:
        if c.role in ("scale", "clean_steps"):
            continue
        assert np.array_equal(trainer.value(c.input), before[c.input]), c.input  # bit-identical
    assert trainer.scale == before["loss_scale"] / 2
    assert trainer.value("clean_steps") == 0


def test_clean_steps_grow_the_scale_after_the_interval():
    step = build(_mlp(), loss="cross-entropy", output="logits", precision="float16",
                 loss_scale=LossScale(init=8.0, interval=3))
    trainer = Trainer(step, lr=0.01)
    scales = [trainer.step(_batch(seed=s)).scale for s in range(7)]
    assert scales == [8.0, 8.0, 16.0, 16.0, 16.0, 32.0, 32.0]


def test_static_scale_never_changes():
    step = build(_mlp(), loss="cross-entropy", output="logits", precision="float16", loss_scale=128)
    trainer = Trainer(step, lr=0.01)
    assert {trainer.step(_batch(seed=s)).scale for s in range(3)} == {128.0}


def _bn_model() -> onnx.ModelProto:
    """x[N,2,4,4] -> Conv(3) -> BatchNormalization -> Relu -> GlobalAveragePool -> Flatten -> logits[N,3]."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (
        ("w", rng.normal(0, 0.5, (3, 2, 3, 3))), ("gamma", np.ones(3)), ("beta", np.zeros(3)),
        ("mean", np.zeros(3)), ("var", np.ones(3)))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["n"], momentum=0.8),
             helper.make_node("Relu", ["n"], ["r"]), helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["logits"])]
    graph = helper.make_graph(nodes, "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 4, 4])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_batchnorm_trains_on_batch_statistics_and_updates_running_ones():
    step = build(_bn_model(), loss="cross-entropy", output="logits", optimizer="sgd", precision="float32",
                 loss_scale="none")
    roles = {c.input: c.role for c in step.spec.carried}
    assert roles["mean"] == "running_mean" and roles["var"] == "running_var"
    assert "mean" not in {c.input for c in step.spec.params}
    trainer = Trainer(step, lr=0.0)  # no update: only the statistics move
    x = np.random.default_rng(4).normal(2.0, 3.0, (5, 2, 4, 4)).astype(np.float32)
    trainer.step({"x": x, "labels": np.zeros(5, np.int64)})
    w = step.initial["w"]
    conv = ort_conv(x, w)
    batch_mean, batch_var = conv.mean(axis=(0, 2, 3)), conv.var(axis=(0, 2, 3), ddof=1)
    np.testing.assert_allclose(trainer.value("mean"), 0.2 * batch_mean, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(trainer.value("var"), 0.8 + 0.2 * batch_var, rtol=1e-4, atol=1e-5)


def test_batchnorm_on_batch_statistics_has_the_loss_and_gradients_of_a_float64_reference():
    """The first SGD step's update (its buffer is the gradient) against central differences of
    train-mode BatchNormalization (biased batch variance) and the loss, in float64."""
    step = build(_bn_model(), loss="cross-entropy", output="logits", optimizer="sgd", precision="float32",
                 loss_scale="none")
    rng = np.random.default_rng(5)
    x = rng.normal(1.0, 2.0, (6, 2, 4, 4)).astype(np.float32)
    labels = np.array([0, 1, 2, 0, 1, 2])
    conv = ort_conv(x, step.initial["w"]).astype(np.float64)

    def loss(gamma: np.ndarray, beta: np.ndarray) -> float:
        mean, var = conv.mean(axis=(0, 2, 3), keepdims=True), conv.var(axis=(0, 2, 3), keepdims=True)
        normed = (conv - mean) / np.sqrt(var + 1e-5) * gamma[None, :, None, None] + beta[None, :, None, None]
        logits = np.maximum(normed, 0).mean(axis=(2, 3))
        shifted = logits - logits.max(1, keepdims=True)
        return float(np.mean(np.log(np.exp(shifted).sum(1)) - shifted[np.arange(6), labels]))

    gamma, beta = (step.initial[k].astype(np.float64) for k in ("gamma", "beta"))
    trainer = Trainer(step, lr=1.0)
    result = trainer.step({"x": x, "labels": labels.astype(np.int64)})
    assert result.loss == pytest.approx(loss(gamma, beta), rel=1e-5)
    h = 1e-6
    for name, value in (("gamma", gamma), ("beta", beta)):
        wanted = []
        for i in range(3):
            step_i = np.eye(3)[i] * h
            moved = {"gamma": gamma, "beta": beta, name: value + step_i}, {"gamma": gamma, "beta": beta,
                                                                        name: value - step_i}
            wanted.append((loss(**moved[0]) - loss(**moved[1])) / (2 * h))
        np.testing.assert_allclose(value - trainer.value(name), wanted, rtol=1e-3, atol=1e-6, err_msg=name)


def test_batch_statistics_divide_and_negate_per_channel_not_per_element():
    """The per-channel factor gamma/std scales the centred input once, ReduceMean's gradient is
    divided before it is broadcast and Sub's is negated once summed: no Div or Neg over the
    activation (there were six for one BatchNormalization)."""
    step = build(_bn_model(), loss="cross-entropy", output="logits", optimizer="sgd", precision="float32",
                 loss_scale="none")
    inferred = onnx.shape_inference.infer_shapes(step.model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in inferred.graph.value_info}
    per_element = [n.op_type for n in step.model.graph.node if shapes.get(n.output[0], [])[1:] == [3, 4, 4]]
    assert "Mul" in per_element and "Sub" in per_element
    assert not {"Div", "Neg"} & set(per_element)


def test_frozen_batchnorm_carries_no_statistics_and_trains_none(tmp_path):
    """A frozen normalisation's running statistics are buffers: neither carried nor descended on
    (AdamW moved a variance of 1e-12 by the learning rate each step, past zero), while its scale
    and bias train; the exported model holds them as they were."""
    step = build(_bn_model(), loss="cross-entropy", output="logits", precision="float32", batchnorm="freeze")
    assert not any(c.role.startswith("running") for c in step.spec.carried)
    assert {c.input for c in step.spec.params} == {"w", "gamma", "beta"}
    trainer = Trainer(step, lr=0.05)
    for _ in range(3):
        trainer.step(_batch_bn())
    io.save(trainer.exported(), tmp_path / "trained.onnx", None)
    trained = {t.name: numpy_helper.to_array(t) for t in onnx.load(tmp_path / "trained.onnx").graph.initializer}
    assert np.array_equal(trained["mean"], np.zeros(3)) and np.array_equal(trained["var"], np.ones(3))
    assert not np.array_equal(trained["gamma"], np.ones(3))


def test_statistics_read_otherwise_and_named_ones_are_parameters():
    """Only a tensor read solely as running statistics is left out: one another node reads too,
    and one ``params`` names, train."""
    model = _bn_model()
    graph = model.graph
    graph.node.insert(len(graph.node), helper.make_node("Add", ["logits", "mean"], ["shifted"]))
    graph.output[0].name = "shifted"
    step = build(model, loss="cross-entropy", output="shifted", precision="float32", batchnorm="freeze")
    assert "mean" in {c.input for c in step.spec.params} and "var" not in {c.input for c in step.spec.params}
    named = build(_bn_model(), loss="cross-entropy", output="logits", precision="float32", batchnorm="freeze",
                  params=["gamma", "var"])
    assert [c.input for c in named.spec.params] == ["gamma", "var"]


def _batch_bn() -> dict[str, np.ndarray]:
    r = np.random.default_rng(8)
    return {"x": r.normal(0, 1, (6, 2, 4, 4)).astype(np.float32), "labels": r.integers(0, 3, 6)}


def ort_conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    from tests.gradcheck import ort_run

    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph([node], "c", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    return ort_run(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), {"x": x},
                   ["y"])["y"]


def test_bfloat16_step_trains_without_loss_scaling():
    step = build(_mlp(), loss="cross-entropy", output="logits", precision="bfloat16")
    assert step.spec.loss_scale["mode"] == "none" and step.report.precision == "bfloat16"
    assert any(t == TensorProto.BFLOAT16 for t in _value_types(step.model))
    trainer = Trainer(step, lr=0.05)
    batch = _batch(n=16)
    losses = [trainer.step(batch).loss for _ in range(8)]
    assert losses[-1] < 0.7 * losses[0] and trainer.scale == 1.0


def _value_types(model: onnx.ModelProto):
    from amp_rewrite.ir.types import typed_index

    return {v.elem_type for v in typed_index(model).all_values()}


def _old_softmax_model(opset: int) -> onnx.ModelProto:
    """x[N,4] -> MatMul(3) -> Reshape [N,3,1,1] -> Softmax (no axis: before opset 13, axis 1 and
    every axis after it, as SqueezeNet's output is made)."""
    w = numpy_helper.from_array(np.random.default_rng(0).normal(0, 1, (4, 3)).astype(np.float32), "w")
    shape = numpy_helper.from_array(np.array([-1, 3, 1, 1], np.int64), "shape")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["z"]), helper.make_node("Reshape", ["z", "shape"], ["r"]),
             helper.make_node("Softmax", ["r"], ["probs"])]
    graph = helper.make_graph(nodes, "old", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 3, 1, 1])], [w, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)


def test_cross_entropy_on_an_old_softmax_is_the_log_of_its_probabilities():
    """``build`` upgrades the model before attaching the loss; attached directly, an opset-12
    model is refused (its softmax terms differ), not given a loss over the wrong axis."""
    model = _old_softmax_model(12)
    batch = {"x": np.random.default_rng(2).normal(0, 1, (5, 4)).astype(np.float32),
             "labels": np.array([[[0]], [[2]], [[1]], [[2]], [[0]]], np.int64)}
    probs = instrument.run(instrument.session(model), {"x": batch["x"]})["probs"].astype(np.float64)
    want = -np.mean(np.log(np.take_along_axis(probs, batch["labels"][:, None], axis=1)))
    step = build(model, loss="cross-entropy", output="probs", optimizer="sgd", precision="float32",
                 loss_scale="none")
    assert Trainer(step, lr=0.0).step(batch).loss == pytest.approx(want, rel=1e-5)
    with pytest.raises(UserError, match="opset 13 or later; the model is at opset 12"):
        attach_loss(model, "cross-entropy", "probs", "labels")


def _loud_mlp() -> onnx.ModelProto:
    """The MLP with a first layer of weights 3000: on generated inputs (standard normal) its
    products reach about 10^4, beyond float16's 65504 / 16; on inputs of magnitude 1e-3, 10."""
    model = _mlp()
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.full((4, 8), 3000.0, np.float32), "w1"))
    return model


def test_the_steps_range_check_runs_on_the_training_data_first() -> None:
    """The step's range check ran on generated inputs although the training data was at hand,
    and a model that did not run on the first generated set stopped the step."""
    data = {"x": np.full((6, 4), 1e-3, np.float32), "labels": np.zeros(6, np.int64)}
    on_data = build(_loud_mlp(), loss="cross-entropy", output="logits", range_data=[data]).report
    generated = build(_loud_mlp(), loss="cross-entropy", output="logits").report
    assert on_data.range_check.startswith("measured") and generated.range_check.startswith("measured")
    def first_layer(report) -> str:
        return next(d.precision for d in report.decisions if d.node == "Gemm#0")

    assert first_layer(generated) == "fp32" and first_layer(on_data) != "fp32"
    unfit = {"x": np.ones((6, 5), np.float32), "labels": np.zeros(6, np.int64)}  # not the model's shape: generated
    assert first_layer(build(_loud_mlp(), loss="cross-entropy", output="logits", range_data=[unfit]).report) == "fp32"


def test_a_step_whose_model_runs_on_no_generated_set_is_built_with_a_warning(monkeypatch) -> None:
    from amp_rewrite.runtime import stages

    def refuse(*args):
        raise RuntimeError("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : no")

    monkeypatch.setattr(stages, "measure", refuse)
    report = build(_mlp(), loss="cross-entropy", output="logits").report
    assert report.range_check.startswith("NOT RUN: onnxruntime could not run the model on generated inputs")
    assert any(n.startswith("warning: NO RANGE WAS MEASURED") for n in report.notes)


@pytest.mark.parametrize("train, freeze, trained", [
    ((), (), ["w1", "b1", "w2", "b2"]),
    (("2$",), (), ["w2", "b2"]),
    ((), ("^w",), ["b1", "b2"]),
    (("head",), (), ["w2", "b2"]),  # the name of the node that reads them
    ((), ("head", "b1"), ["w1"]),
])
def test_train_and_freeze_choose_the_parameters_by_their_names_and_their_readers(train, freeze, trained) -> None:
    model = _mlp()
    model.graph.node[2].name = "head"
    step = build(model, loss="cross-entropy", output="logits", precision="float32", train=train, freeze=freeze)
    assert [p.input for p in step.spec.params] == trained
    frozen = {"w1", "b1", "w2", "b2"} - set(trained)
    assert {t.name for t in step.model.graph.initializer} >= frozen  # constants of the step, no gradient for them
    assert not any(f"{name}_grad" in o for o in (n.output for n in step.model.graph.node) for name in frozen)


def test_patterns_that_leave_nothing_to_train_are_one_error() -> None:
    with pytest.raises(UserError, match="leave none of the 4 parameters to train"):
        build(_mlp(), loss="cross-entropy", output="logits", precision="float32", freeze=(".",))
    with pytest.raises(UserError, match="not a regular expression"):
        build(_mlp(), loss="cross-entropy", output="logits", precision="float32", train=("(",))


def test_clipping_scales_the_gradients_to_their_global_norm_as_pytorch_does() -> None:
    """torch.nn.utils.clip_grad_norm_(params, max_norm) then SGD without momentum: one step."""
    from amp_rewrite.training.graph.optimizers import SGD

    step = build(_mlp(), loss="cross-entropy", output="logits", optimizer=SGD(momentum=0.0),
                 precision="float32", loss_scale="none", clip_norm=0.05)
    trainer = Trainer(step, lr=0.1)
    weights = {k: v.astype(np.float64) for k, v in step.initial.items()}
    batch = _batch(seed=4)
    _, grads = _numpy_loss_grads(weights, batch)
    norm = np.sqrt(sum(float((g * g).sum()) for g in grads.values()))
    assert norm > 0.05  # the clip applies
    trainer.step(batch)
    for name, g in grads.items():
        assert np.allclose(trainer.value(name), weights[name] - 0.1 * g * 0.05 / (norm + 1e-6), atol=1e-6), name


def test_schedules() -> None:
    from amp_rewrite.training.runner.schedules import Schedule

    cosine = Schedule("cosine", warmup=2, total=12)
    assert [cosine.factor(s) for s in (0, 1, 2, 7, 12, 20)] == pytest.approx([0.5, 1.0, 1.0, 0.5, 0.0, 0.0])
    assert [Schedule("step", step_size=3, gamma=0.5).factor(s) for s in (0, 2, 3, 6)] == [1, 1, 0.5, 0.25]
    assert Schedule().factor(100) == 1.0
    with pytest.raises(UserError, match="step-size"):
        Schedule("step")


def test_a_first_step_whose_gradients_overflow_is_taken_again_until_the_scale_fits():
    """No batch of a short fine-tune is lost to the dynamic scale's descent: the first batch is
    taken again (the scale halving) until its update applies, and training then goes on as it
    would have from the scale found."""
    rng = np.random.default_rng(5)
    data = {"x": rng.normal(0, 300, (32, 4)).astype(np.float32), "labels": rng.integers(0, 3, 32).astype(np.int64)}
    searching = Trainer(build(_mlp(), loss="cross-entropy", output="logits", precision="float16"), lr=0.01)
    history = searching.fit(data, epochs=2, batch_size=8, progress=False)
    found = searching.searched
    assert found > 0 and history.skipped_steps[:found] == list(range(1, found + 1))
    later = history.skipped_steps[found:]  # an overflow after the first update is skipped, not taken again
    assert searching.steps == 8 + found and searching.value("step") == 8 - len(later)
    scale = LossScale(init=2.0**16 / 2**found)
    direct = Trainer(build(_mlp(), loss="cross-entropy", output="logits", precision="float16", loss_scale=scale),
                     lr=0.01)
    direct.fit(data, epochs=2, batch_size=8, progress=False)
    assert direct.searched == 0 and direct.scale == searching.scale
    for name, value in searching.weights.items():
        assert np.array_equal(value, direct.weights[name]), name


def test_steps_that_accumulate_or_keep_a_static_scale_do_not_search():
    for kwargs in ({"accumulate": 2}, {"loss_scale": 1024.0}):
        step = build(_mlp(), loss="cross-entropy", output="logits", precision="float16", **kwargs)
        assert not Trainer(step).searching


def test_a_float32_run_that_diverges_says_so():
    """Without loss scaling a step applies inf/NaN gradients: the check after training names the
    divergence (not a loss spelled in a way it did not recognize)."""
    step = build(_mlp(), loss="cross-entropy", output="logits", optimizer="sgd", precision="float32")
    rng = np.random.default_rng(0)
    data = {"x": rng.normal(0, 1, (32, 4)).astype(np.float32), "labels": rng.integers(0, 3, 32).astype(np.int64)}
    with pytest.raises(UserError, match="training diverged: the trained model's cross-entropy loss is nan"):
        Trainer(step, lr=1e30).fit(data, epochs=2, batch_size=8, progress=False)
